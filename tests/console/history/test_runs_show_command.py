"""`runs show` of a new user's command job on a local pod, once it has ended (tests/console/launch/
new_user_job.py): each worker's last step as `status` saw it (read from the run's archive), the code as
the project it ran (its digest), and only the metrics the run has: its step time and loss, no reward."""

from __future__ import annotations

import json

import pytest

from tests.console.launch.new_user_job import launch_new_user_job
from tests.console.launch.test_launch_command import follow
from tests.console.launch.test_local import pod, run  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.history.store import RunStore

pytestmark = pytest.mark.usefixtures("console_home", "pod")


def test_runs_show_gives_the_last_step_the_projects_code_and_only_the_metrics_the_run_has(capsys, tmp_path):
    run_id = launch_new_user_job(capsys, tmp_path, 30)
    status, _ = follow(capsys, run_id)
    assert status == 0
    record = RunStore().get(run_id)
    assert record.finished and record.archive_path
    digest = record.job["project"]["digest"]

    status, out, _ = run(capsys, "status", run_id, "--json")
    assert [w["last_step"]["step"] for w in json.loads(out)["worker_status"]] == [30, 30]
    status, out, _ = run(capsys, "runs", "show", run_id, "--json")
    shown = json.loads(out)
    assert [w["last_step"]["step"] for w in shown["worker_status"]] == [30, 30]
    assert [w["last_step"]["loss"] for w in shown["worker_status"]] == [pytest.approx(1 / 30, abs=1e-4)] * 2
    assert shown["code_version"] == digest

    status, out, _ = run(capsys, "runs", "show", run_id)
    assert status == 0
    lines = out.splitlines()
    code = next(line for line in lines if line.startswith("code "))
    assert code.split(None, 1)[1] == f"project my-project, digest {digest[:12]}"
    header = next(i for i, line in enumerate(lines) if line.startswith("WORKER"))
    step_column = lines[header].index("STEP ")
    assert [lines[header + 1 + w][step_column:].split()[0] for w in (0, 1)] == ["30", "30"]
    summary = lines[next(i for i, line in enumerate(lines) if line.startswith("SUMMARY")) + 1:]
    summary = summary[: summary.index("")]
    labels = [line.rsplit("  ", 1)[0].strip() for line in summary if not line.startswith("-")]
    assert "reward mean (last step)" not in labels and not any("HBM" in label for label in labels)
    assert labels[:2] == ["step time, avg of last 10 (s)", "loss (last step)"], summary
    loss = next(line for line in summary if line.startswith("loss"))
    assert loss.split()[-1] == "0.0333"  # as the program printed it
