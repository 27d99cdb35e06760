"""A run's record outlives its node: the supervisor writes it to a Cloud Storage bucket (an emulator on
127.0.0.1 here, reached through the JSON API with urllib on the pod's side and google-cloud-storage on the
console's) before it deletes the node, and an empty console home lists that run with its end and why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.console.launch.test_local import run
from tests.console.observe.test_supervision import (  # noqa: F401 - pod2 is a fixture
    fake_trainer,
    launch_then_kill_console,
    node_dir,
    pod2,
)
from tests.console.worker.test_supervisor import make, metadata_server  # noqa: F401 - a fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.errors import UserError
from tpu_console.history import bucket_record
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.settings import Settings, load_settings
from tpu_console.worker import supervisor as sv

pytestmark = pytest.mark.usefixtures("console_home")
BUCKET = "team-runs"


@pytest.fixture
def gcs_emulator(monkeypatch) -> Iterator[str]:
    """gcp-storage-emulator on 127.0.0.1 with an empty bucket; its endpoint as STORAGE_EMULATOR_HOST."""
    server_module = pytest.importorskip("gcp_storage_emulator.server")
    server = server_module.create_server("127.0.0.1", 0, in_memory=True, default_bucket=BUCKET)
    server.start()
    endpoint = f"http://127.0.0.1:{server._api._httpd.server_address[1]}"
    monkeypatch.setenv(bucket_record.EMULATOR_ENV, endpoint)
    yield endpoint
    server.stop()


def use_home(monkeypatch, path, bucket: str | None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if bucket:
        (path / "config.toml").write_text(f'[gcp]\nbucket = "{bucket}"\n')
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(path))


def test_a_node_the_supervisor_deleted_unwatched_is_listed_from_the_bucket_by_an_empty_home(
        capsys, monkeypatch, tmp_path, console_home, gcs_emulator, pod2):  # noqa: F811
    use_home(monkeypatch, console_home, f"gs://{BUCKET}/lab")
    job = fake_trainer(tmp_path, (
        """echo '{"t": 1, "kind": "step", "process": 0, "step": 7, "loss": 0.5}' >> events.jsonl\n"""
        "echo last words of $TRAINER_PROCESS_ID with $HF_TOKEN\nsleep 1000\n"))
    env_file = tmp_path / ".env"
    env_file.write_text("HF_TOKEN=hf_not_a_real_token_42\n")
    run_id, _ = launch_then_kill_console(job, "--max-hang", "3s", "--env-file", str(env_file))  # unwatched
    wait_for(lambda: not node_dir().exists(), timeout=60)
    assert not RunStore().get(run_id).finished  # the launching home never saw it end
    status, out, err = run(capsys, "runs", "--json")
    (listed,) = [r for r in json.loads(out)["runs"] if r["run_id"] == run_id]
    assert status == 0 and listed["state"] == "stopped" and "(max-hang)" in listed["failure"], err

    use_home(monkeypatch, tmp_path / "third-home", f"gs://{BUCKET}/lab")  # an empty home, the same bucket
    status, out, err = run(capsys, "runs", "--json")
    assert status == 0, err
    (listed,) = [r for r in json.loads(out)["runs"] if r["run_id"] == run_id]
    assert listed["node"] == "pod" and listed["state"] == "stopped"
    assert "stopped by its supervisor (max-hang): no worker made a step for 3s" in listed["failure"]
    assert "node deleted" in listed["failure"]
    record = RunStore().get(run_id)  # now cached in this home's history, ended, with the metric summary
    assert record.finished and record.summary and record.summary.get("step") == 7
    status, out, _ = run(capsys, "runs")
    assert status == 0 and run_id in out and "max-hang" in out

    use_home(monkeypatch, tmp_path / "fourth-home", f"gs://{BUCKET}/lab")  # a run id alone finds it too
    status, out, err = run(capsys, "runs", "show", run_id)
    assert status == 0, err
    assert f"{run_id}  stopped" in out and "failure   stopped by its supervisor (max-hang)" in out
    status, out, err = run(capsys, "status", run_id)  # the node is gone: the record's word stands
    kept = RunStore().get(run_id)
    assert (kept.state, kept.failure.split(":")[0]) == ("stopped", "stopped by its supervisor (max-hang)")

    # the object itself: the launch, the decisions up to the deletion, each worker's last lines
    data = bucket_record.read_records(bucket_record.configured(load_settings()))[0]
    assert data["launch"]["run_id"] == run_id and data["reason"] == "max-hang"
    assert [d["decision"] for d in data["decisions"]][-1] == "deleting"
    assert "last words of 1 with ***" in data["workers"]["1"]["tail"]  # the team's bucket has no secret
    assert "hf_not_a_real_token_42" not in json.dumps(data)


def test_a_bucket_that_cannot_be_reached_is_a_warning_and_the_history_still_lists(
        capsys, monkeypatch, console_home):  # noqa: F811
    use_home(monkeypatch, console_home, f"gs://{BUCKET}")
    monkeypatch.setenv(bucket_record.EMULATOR_ENV, "http://127.0.0.1:9")  # nothing listens there
    status, out, err = run(capsys, "runs")
    assert status == 0
    assert f"warning: the run records in gs://{BUCKET}/tpu-console/runs/ cannot be read" in err
    assert "no runs yet" in err


def test_a_bucket_setting_that_is_not_one_is_named_with_its_fix(capsys, monkeypatch, console_home):  # noqa: F811
    use_home(monkeypatch, console_home, "s3://elsewhere")
    status, _, err = run(capsys, "runs")
    assert status == 2
    assert err.startswith("error: setting 'gcp.bucket'") and "gs://BUCKET[/PATH]" in err
    with pytest.raises(UserError, match="neither gs://BUCKET"):  # the parser's own guard, for what gets past
        bucket_record.parse_bucket("gs://")


def test_a_record_ends_a_run_the_history_thought_running_and_a_finished_one_is_left_be(tmp_path):
    store = RunStore(tmp_path / "h.sqlite")
    store.add(RunRecord("20260101-000000-abcd", "n", "gcp", "v6e-16", [0, 1], "c.yaml", "d", [], "python",
                        datetime.now(UTC), state="running"))
    data = {"run_id": "20260101-000000-abcd", "node": "n", "provider": "gcp", "outcome": "failed",
            "reason": "on-end", "written_at": 1_700_000_100.0,
            "launch": {"accelerator_type": "v6e-16", "started_at": "2023-11-14T22:13:20+00:00",
                       "config_source": "c.yaml", "workers": [0, 1]},
            "decisions": [{"t": 1_700_000_050.0, "decision": "ended", "message": "the run failed"},
                          {"t": 1_700_000_060.0, "decision": "deleting", "message": "deleting node n"}],
            "workers": {"0": {"state": "done", "exit_status": 143, "stopped": "supervisor"},
                        "1": {"state": "done", "exit_status": 3, "cause": "oom", "stopped": None}}}
    # the node is still there: the console's own look ends it (and copies its logs home)
    assert not bucket_record.merge(store, {**data, "decisions": data["decisions"][:1]})
    assert bucket_record.merge(store, data)  # the node is gone: the record is all there is
    record = store.get(data["run_id"])
    assert (record.state, record.failure) == ("failed", "worker 1 exited 3 (oom); node deleted by the "
                                                        "supervisor (on-end)")
    assert record.finished and record.worker_records[1].exit_status == 3
    other = RunStore(tmp_path / "other.sqlite")  # a home that never saw it: the run as the record has it
    assert bucket_record.merge(other, data)
    record = other.get(data["run_id"])
    assert (record.node, record.accelerator_type, record.config_path, record.workers) == (
        "n", "v6e-16", "c.yaml", [0, 1])
    assert record.finished_at.timestamp() == 1_700_000_050.0  # the supervisor's `ended`
    assert not bucket_record.merge(store, {**data, "outcome": "succeeded"})  # ended already: the cache wins
    assert not bucket_record.merge(store, {**data, "run_id": "../etc"})


def test_on_a_tpu_vm_the_record_goes_up_with_the_vms_token_and_a_failure_is_a_decision(
        tmp_path, gcs_emulator, metadata_server):  # noqa: F811
    s, _ = make(tmp_path)
    s.decide("ended", "the run succeeded")
    s.ended = "succeeded"
    s.plan["record"] = {"kind": "gcs", "bucket": BUCKET, "prefix": "tpu-console/runs/", "tail_lines": 20,
                        "endpoint": gcs_emulator, "auth": "metadata", "metadata_url": metadata_server.url}
    s.save_record()
    assert metadata_server.asked  # the VM's own service account, from the metadata server
    (data,) = bucket_record.read_records(bucket_record.parse_bucket(f"gs://{BUCKET}"))
    assert (data["run_id"], data["outcome"], data["decisions"][-1]["decision"]) == (
        s.launch.run_id, "succeeded", "ended")

    s.plan["record"] = {**s.plan["record"], "endpoint": "http://127.0.0.1:9"}  # nothing listens there
    s.save_record()  # says so, and carries on: the node is still deleted after it
    (failed,) = [d for d in sv_decisions(s) if d["decision"] == "record-failed"]
    assert f"not written to gs://{BUCKET}/tpu-console/runs/" in failed["message"]


def sv_decisions(s: sv.Supervisor) -> list[dict]:
    with open(f"{s.folder}/{sv.DECISIONS_FILE}") as f:
        return [json.loads(line) for line in f]


def test_where_each_pod_writes_its_record(monkeypatch, console_home):  # noqa: F811
    def target(provider: str, bucket: str | None) -> tuple | None:
        found = bucket_record.supervisor_target(Settings(gcp={"bucket": bucket}), provider)
        return found and (found["kind"], found.get("path") or found["bucket"], found.get("auth"))

    home_folder = str(console_home / "run-records")
    monkeypatch.delenv(bucket_record.EMULATOR_ENV, raising=False)
    assert target("gcp", "gs://b/lab") == ("gcs", "b", "metadata")  # with the TPU VM's service account
    assert target("gcp", None) is None and target("ssh", "gs://b") is None  # no metadata server to ask
    assert target("gcp", "file:///shared") is None  # a folder on the pod would be no record
    assert target("local", None) == target("local", "gs://b") == ("folder", home_folder, None)
    assert target("local", "file:///shared") == ("folder", "/shared", None)
    monkeypatch.setenv(bucket_record.EMULATOR_ENV, "127.0.0.1:9023")
    assert target("local", "gs://b") == target("ssh", "gs://b") == ("gcs", "b", "none")
