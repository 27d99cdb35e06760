"""A checkpoint before the pod goes: on a local pod whose job runners watch a fake metadata server on
127.0.0.1 (GCE_METADATA_HOST, given through the run's .env), `instance/preempted` turns TRUE mid-run. The
tiny trainer saves a complete checkpoint of its last step and the run ends `preempted`, with the notice in
events.jsonl; a foreign program is given the same signal and notice file, and checkpoints as
docs/contract.md asks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.launch.test_local import CONFIG, run, run_folder, worker_home
from tests.console.observe.test_supervision import decided, decisions, exit_status
from tests.fake_metadata import FakeMetadata
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console import cli
from tpu_console.providers.local.jobs import running_job_groups, stop_groups
from tpu_console.worker.preemption_notice import METADATA_HOST_ENV, PREEMPTED_KEY
from trainer.checkpoint import Checkpointer
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")

FOREIGN = str(Path(__file__).resolve().parents[1] / "launch" / "foreign_job.py")  # beside the launch tests


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    fake = FakeMetadata()
    yield fake
    fake.close()


@contextlib.contextmanager
def local_pod(capsys, kind: str, workers: int) -> Iterator[None]:
    assert cli.main(["create", "pod", "--type", kind]) == 0
    capsys.readouterr()
    try:
        yield
    finally:  # a test that failed half-way leaves no detached job or supervisor behind
        for worker in range(workers):
            stop_groups(running_job_groups(worker_home(worker)), grace_s=1.0)
            runs = worker_home(worker) / "tpu-console" / "runs"
            for pid_file in runs.glob("*/supervisor.pid") if runs.exists() else ():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)


def events(worker: int, run_id: str) -> list[dict]:
    path = run_folder(worker, run_id) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def steps(worker: int, run_id: str) -> list[int]:
    return [e["step"] for e in events(worker, run_id) if e["kind"] == "step"]


def vm_env(tmp_path: Path, metadata: FakeMetadata) -> str:
    path = tmp_path / "vm.env"
    path.write_text(f"{METADATA_HOST_ENV}={metadata.host}\n")
    return str(path)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_tiny_trainer_checkpoints_on_the_notice_and_the_run_ends_preempted(
        capsys, tmp_path, tiny_model_dir, metadata):
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 64, seed=0)
    ckpt = tmp_path / "ckpt"
    sets = [f"model_path={tiny_model_dir}", f"data.path={data}", "steps=200", "eval_every_steps=0",
            "rollout.global_length=64", "rollout.max_length_sample=8", f"checkpoint.dir={ckpt}",
            "checkpoint.every_steps=0"]  # no checkpoint but the notice's
    with local_pod(capsys, "local-1x1", 1):
        status, out, err = run(capsys, "launch", "pod", "--json", "--config", str(CONFIG), "--python",
                               sys.executable, "--no-plan-check", "--env-file", vm_env(tmp_path, metadata),
                               *(arg for value in sets for arg in ("--set", value)))
        assert status == 0, err
        run_id = json.loads(out)["run_id"]
        # the first compile: a minute here, several on a busy 2-core machine
        wait_for(lambda: len(steps(0, run_id)) >= 2, timeout=600, poll=0.5)
        metadata.flip(PREEMPTED_KEY, "TRUE")
        wait_for(lambda: decided(run_id, "ended"), timeout=90, poll=0.5)
        made = decisions(run_id)
        log = (run_folder(0, run_id) / "output.log").read_text()
        assert made[-1]["outcome"] == "preempted", log[-3000:]
        assert [d["decision"] for d in made].count("preemption-notice") == 1
        assert exit_status(run_id, 0) == "143"
        seen = events(0, run_id)
        [notice] = [e for e in seen if e["kind"] == "preemption"]
        assert notice["source"] == "preempted" and notice["deadline"] == pytest.approx(notice["seen_at"] + 30)
        [saved] = [e for e in seen if e.get("checkpoint_step")]
        last = max(steps(0, run_id))
        assert saved["checkpoint_step"] == last and saved["notice_source"] == "preempted"
        assert 0 < saved["notice_to_checkpoint_s"] < 30 and saved["seconds_left"] > 0
        # complete: orbax lists it, and its folder is the renamed, finished one
        assert Checkpointer(str(ckpt), 0, 2).latest_step() == last
        assert [p.name for p in ckpt.iterdir() if p.name.isdigit()] == [str(last)]
        status, out, _ = run(capsys, "status", run_id)
        assert status == 0 and "supervisor: the run preempted" in out


@pytest.mark.timeout(200)
def test_a_foreign_program_gets_the_same_signal_and_notice_and_checkpoints(capsys, tmp_path, metadata):
    with local_pod(capsys, "local-2x1", 2):
        status, out, err = run(capsys, "launch", "pod", "--json", "--env-file", vm_env(tmp_path, metadata),
                               "--", sys.executable, FOREIGN, "preemptible")
        assert status == 0, err
        run_id = json.loads(out)["run_id"]
        wait_for(lambda: all(len(steps(w, run_id)) >= 3 for w in (0, 1)), timeout=60)
        metadata.flip(PREEMPTED_KEY, "TRUE")
        wait_for(lambda: decided(run_id, "ended"), timeout=60)
        assert decisions(run_id)[-1]["outcome"] == "preempted"
        for worker in (0, 1):
            checkpoint = json.loads((run_folder(worker, run_id) / "checkpoint.json").read_text())
            assert checkpoint["source"] == "preempted" and 20 < checkpoint["seconds_left"] <= 30
            assert checkpoint["step"] >= 3
            assert exit_status(run_id, worker) == "143"  # its own status: stopped by the SIGTERM
            assert [e["kind"] for e in events(worker, run_id)].count("preemption") == 1
