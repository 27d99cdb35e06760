"""How often `tpu-console status RUN` reaches the node, on a local pod with a running job: one connection
and one command per worker for one look (the run's state, its last events and lines, and the supervisor's
decisions together). Counted at the Fleet, where every SSH command goes through."""

from __future__ import annotations

import pytest

from tests.console.launch.test_local import fake_trainer, launch, pod, run, run_folder  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.fleet.fleet import Fleet

pytestmark = pytest.mark.usefixtures("console_home", "pod")

STEPPING = """\
echo '{"t": 1, "kind": "step", "process": '$TRAINER_PROCESS_ID', "step": 1, "time/train/step_s": 0.5}' >> events.jsonl
echo stepped
for _ in $(seq 600); do sleep 0.1; done
"""  # noqa: E501 - an event line of the fake trainer; it ends by itself if the test is killed before its stop


def test_status_of_a_running_run_reaches_each_worker_once(capsys, tmp_path, monkeypatch):
    run_id = launch(capsys, fake_trainer(tmp_path, STEPPING))
    wait_for(lambda: all((run_folder(w, run_id) / "events.jsonl").exists() for w in (0, 1))
             and (run_folder(0, run_id) / "supervisor.jsonl").exists())
    opened, commands = [], []
    real_init, real_run = Fleet.__init__, Fleet.run

    def counting_init(self, targets, *args, **kwargs):
        opened.append(sorted(t.worker for t in targets))
        real_init(self, targets, *args, **kwargs)

    async def counting_run(self, command, workers=None, **kwargs):
        commands.append(sorted(workers if workers is not None else self.targets))
        return await real_run(self, command, workers, **kwargs)

    try:
        with monkeypatch.context() as counted:
            counted.setattr(Fleet, "__init__", counting_init)
            counted.setattr(Fleet, "run", counting_run)
            status, out, err = run(capsys, "status", run_id)
        assert status == 0, err
        assert "running" in out.splitlines()[0]
        assert "supervisor: supervising 2 worker(s)" in out  # the decisions came with the same look
        assert opened == [[0, 1]], "status connected to the node more than once"
        assert commands == [[0, 1]], f"status sent {len(commands)} commands per look: {commands}"
    finally:
        stopped, _, err = run(capsys, "stop", run_id, "--yes", "--grace", "1")
        assert stopped == 0, err
