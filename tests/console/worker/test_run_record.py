"""The run's record as written at launch (worker/run_record.py): what launch.json holds, read back the same,
a record of an older schema read with its gaps defaulted, one of an unknown schema refused in one line."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tpu_console.history.store import RunRecord
from tpu_console.worker import run_record
from tpu_console.worker.run_record import LaunchRecord, RecordError

RUN = "20260101-000000-abcd"


def launched() -> LaunchRecord:
    return LaunchRecord(
        run_id=RUN, node="pod", provider="gcp", accelerator_type="v6e-16", workers=[0, 1, 2, 3], slices=2,
        started_at="2026-01-01T00:00:00+00:00", python="python3", command=["python3", "train.py"],
        config_source="job.toml", config_digest="d1", code_version={"git_sha": "abc", "dirty": True},
        job={"kind": "command", "command": ["python3", "train.py"], "metrics": {"format": "none"}},
        launched_by={"user": "bob"}, fail_fast=True, supervised=True, price_per_hour=12.5,
        managed={"run": "nightly", "incarnation": 3},
    )


def test_a_record_reads_back_as_written_each_worker_with_its_own_environment(tmp_path):
    record = launched()
    mine = record.for_worker(2, {"TPU_CONSOLE_WORKER": "2"}, ".env")
    (tmp_path / run_record.FILE).write_bytes(mine.dumps())
    assert json.loads(mine.dumps())["schema"] == run_record.SCHEMA
    assert "config" not in mine.to_json()  # a command has no trainer config
    assert run_record.read(str(tmp_path)) == mine
    assert (mine.worker, mine.env, mine.env_file) == (2, {"TPU_CONSOLE_WORKER": "2"}, ".env")
    assert not record.steps_read and record.kind == "command"

    history = RunRecord.from_launch(record)  # the history's entry is built from the same record
    assert (history.config_path, history.code_version, history.slices, history.price_per_hour) == (
        "job.toml", "abc+dirty", 2, 12.5)
    assert history.started_at == datetime(2026, 1, 1, tzinfo=UTC)


def test_a_record_of_the_first_schema_reads_with_what_it_lacks_defaulted():
    old = {"run_id": RUN, "node": "pod", "provider": "local", "accelerator_type": "v6e-8", "worker": 0,
           "workers": [0, 1], "started_at": "2025-06-01T10:00:00+00:00", "code_version": None,
           "python": "python3", "command": ["python3", "-u", "-m", "trainer"], "env": {"A": "1"},
           "fail_fast": False, "config_source": "configs/tiny.yaml", "overrides": ["steps=2"],
           "config_digest": "cafe", "config": {"steps": 2}}  # no schema, job, launched_by, slices, price
    record = LaunchRecord.from_json(old)
    assert (record.config_source, record.overrides, record.config) == (
        "configs/tiny.yaml", ["steps=2"], {"steps": 2})
    assert (record.job, record.launched_by, record.slices, record.price_per_hour, record.managed) == (
        None, None, 1, None, None)
    assert record.kind == "trainer" and record.steps_read and record.code_text is None
    # a command of that schema named no source: its command line is
    command = LaunchRecord.from_json({"run_id": RUN, "node": "pod", "job": {
        "kind": "command", "command": ["python", "my train.py"]}})
    assert command.config_source == "python 'my train.py'" and command.command == ["python", "my train.py"]
    # a record with neither run id nor node takes its folder's and its node's
    assert (LaunchRecord.from_json({}, RUN, "pod").run_id, LaunchRecord.from_json({}, RUN, "pod").node) == (
        RUN, "pod")


def test_a_record_of_an_unknown_schema_or_not_a_record_is_one_line_that_says_what_to_do(tmp_path):
    with pytest.raises(RecordError) as newer:
        LaunchRecord.from_json({"schema": run_record.SCHEMA + 1, "run_id": RUN, "node": "pod"})
    message = str(newer.value)
    assert "\n" not in message and RUN in message and "update tpu-console" in message
    with pytest.raises(RecordError, match="not JSON"):
        LaunchRecord.loads("{", RUN)
    with pytest.raises(RecordError, match="not a JSON object"):
        LaunchRecord.from_json([1, 2], RUN)
    (tmp_path / run_record.FILE).write_text(json.dumps({"schema": "two"}))
    assert run_record.read(str(tmp_path)) is None  # the supervisor carries on without it
    assert run_record.read(str(tmp_path / "no-such-run")) is None
