"""The controller as a daemon on this machine: `controller start` (detached here: no systemd user manager
in the test's container) says what it is and what it survives, serves a run handed over by `launch
--managed`, brings it back after its local pod is preempted (a real daemon process, a real pod), and
`controller status`, `runs show`, `controller stop` read and end it; `controller cancel` is refused
without --yes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.console.experiments.test_local import CHECKPOINTING
from tests.console.launch.test_local import CONFIG, fake_trainer, run
from tests.fixtures_cli import console_home, stand_in_tiny_inputs  # noqa: F401 - fixture
from tpu_console.controller import daemon
from tpu_console.controller import state as st
from tpu_console.controller.lease import read_lease
from tpu_console.controller.store import open_store
from tpu_console.providers.local import LocalProvider
from tpu_console.settings import load_settings

pytestmark = pytest.mark.usefixtures("console_home")


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s; log:\n" + "\n".join(daemon.logs(40)))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_managed_run_is_brought_back_by_the_daemon_after_its_pod_is_preempted(
        capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_CONTROLLER_POLL_S", "0.5")
    assert run(capsys, "create", "spot", "--type", "local-2x1")[0] == 0
    status, out, err = run(capsys, "controller", "start", "--detached")
    assert status == 0 and "detached process" in out and "not a reboot" in out, (out, err)
    try:
        store = open_store(load_settings({}))
        wait_until(lambda: read_lease(store), 30, "the daemon takes the lease")
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        stand_in_tiny_inputs([tmp_path])
        status, out, err = run(
            capsys, "launch", "spot", "--config", str(CONFIG), "--managed", "--max-recoveries", "2",
            "--python", fake_trainer(tmp_path, CHECKPOINTING), "--fail-fast", "--no-plan-check",
            "--set", f"checkpoint.dir={ckpt}", "--set", "checkpoint.every_steps=1", "--set", "steps=8",
            "--set", f"model_path={tmp_path / 'tiny-qwen2'}",
            "--set", f"data.path={tmp_path / 'gsm8k-synthetic.jsonl'}")
        assert status == 0 and "managed as m" in err, err
        first_run = out.strip().splitlines()[-1]
        (managed,) = st.all_runs(store)
        wait_until(lambda: (ckpt / "latest").exists() and int((ckpt / "latest").read_text()) >= 3, 60,
                   "three steps checkpointed")
        asyncio.run(LocalProvider().preempt("spot"))
        done = wait_until(lambda: (r := st.load(store, managed.run.id).run).state.terminal and r, 200,
                          "the managed run ends")
        assert done.status == "SUCCEEDED" and len(done.incarnations) == 2, done
        assert done.incarnations[0].run_id == first_run and done.incarnations[0].ended == "preempted"
        (recovery,) = done.recoveries
        assert recovery.resumed_step >= 3 and recovery.seconds > 0
        status, out, err = run(capsys, "controller", "status")
        assert status == 0 and "acting controller:" in out and done.id in out and "SUCCEEDED" in out, out
        status, out, err = run(capsys, "runs")
        assert status == 0 and f"managed {done.id}: succeeded" in out and "controller: " in out, out
        status, out, err = run(capsys, "runs", "show", done.incarnations[1].run_id)
        assert status == 0 and f"managed run {done.id}: SUCCEEDED" in out and "preempted" in out, out
        assert "to the first new step" in out and "lost to preemptions" in out, out
        status, out, err = run(capsys, "controller", "cancel", done.id)
        assert status == 2 and "add --yes" in err
    finally:
        status, out, err = run(capsys, "controller", "stop")
    assert status == 0 and "stopped the controller" in err, err
    assert daemon.status() is None and read_lease(store) is None  # the lease given back at once
    status, out, err = run(capsys, "controller", "status", "--json")
    assert json.loads(out)["here"] is None


def test_the_user_service_keeps_the_home_and_the_name_it_was_started_with(monkeypatch, tmp_path):
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(tmp_path))
    monkeypatch.delenv(daemon.WHERE_ENV, raising=False)
    assert f"Environment=TPU_CONSOLE_HOME={tmp_path}\n" in daemon.unit_text()
    assert daemon.WHERE_ENV not in daemon.unit_text()
    monkeypatch.setenv(daemon.WHERE_ENV, "ctl")  # `start --on ctl` names the controller there so
    assert f"Environment={daemon.WHERE_ENV}=ctl\n" in daemon.unit_text()
