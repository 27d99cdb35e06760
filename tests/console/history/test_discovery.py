"""Reading a worker's run folders: the recipe run by bash in a stand-in worker home, and a launch.json
made into a history entry."""

from __future__ import annotations

import json
import os
import subprocess

from tpu_console.history import discovery
from tpu_console.history.store import RunRecord
from tpu_console.worker.run_record import RecordError


def test_the_recipe_prints_the_launch_json_of_the_runs_the_history_lacks(tmp_path):
    runs = tmp_path / "tpu-console" / "runs"
    launch = {"node": "pod", "provider": "gcp", "accelerator_type": "v6e-16", "workers": [0, 1, 2, 3],
              "started_at": "2026-01-01T00:00:00+00:00", "code_version": {"git_sha": "abc", "dirty": True},
              "python": "python3", "command": ["python", "train.py"], "launched_by": {"user": "bob"},
              "job": {"kind": "command", "command": ["python", "train.py"], "job_file": None}}
    for run_id in ("20260101-000000-aaaa", "20260102-000000-bbbb"):
        (runs / run_id).mkdir(parents=True)
        (runs / run_id / "launch.json").write_text(json.dumps(launch))
    (runs / "20260103-000000-cccc").mkdir()  # no launch.json (yet): left out
    (runs / "20260104-000000-dddd").mkdir()  # launched by a newer console: said, never guessed at
    (runs / "20260104-000000-dddd" / "launch.json").write_text(json.dumps({**launch, "schema": 99}))
    (runs / "not-a-run").mkdir()
    (runs / "not-a-run" / "launch.json").write_text("{}")
    command = discovery.list_runs_recipe(["20260101-000000-aaaa"])
    done = subprocess.run(["bash", "-c", command], env={**os.environ, "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=30, check=True)
    found = discovery.parse_found(done.stdout, "pod")
    assert sorted(found) == ["20260102-000000-bbbb", "20260104-000000-dddd"]
    assert "schema 99" in str(found["20260104-000000-dddd"]) and isinstance(
        found["20260104-000000-dddd"], RecordError)

    record = RunRecord.from_launch(found["20260102-000000-bbbb"])  # a record written before `schema`
    assert (record.node, record.provider, record.workers) == ("pod", "gcp", [0, 1, 2, 3])
    assert (record.config_path, record.code_version) == ("python train.py", "abc+dirty")
    assert record.launched_by == {"user": "bob"} and not record.finished and record.state == "pending"


def test_a_worker_without_runs_says_nothing(tmp_path):
    done = subprocess.run(["bash", "-c", discovery.list_runs_recipe([])], env={**os.environ,
                          "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=30, check=True)
    assert discovery.parse_found(done.stdout, "pod") == {}
