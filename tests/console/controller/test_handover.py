"""Handing a run to the controller: a job file's [recovery] and launch's flags give the budgets (bad values
refused in one line, naming the key or flag); a managed launch that could not be recovered is refused before
anything starts (a supervisor that deletes the node, a worker subset, the trainer without checkpoints a new
node can read)."""

from __future__ import annotations

import pytest

from tests.console.launch.test_local import CONFIG, run, worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.controller.handover import budgets_of
from tpu_console.errors import UserError
from tpu_console.launch.job_spec import load_job_file

pytestmark = pytest.mark.usefixtures("console_home")


def test_the_budgets_come_from_the_job_files_recovery_with_the_flags_over_it(tmp_path):
    job_file = tmp_path / "job.toml"
    job_file.write_text('command = "python train.py"\n[recovery]\nmax_recoveries = 5\ndeadline = "2h"\n'
                        'max_cost = 40\nlost_after = "15m"\ndoctor = false\n')
    job = load_job_file(job_file)
    budgets = budgets_of(job.recovery, now=1000.0)
    assert (budgets.max_recoveries, budgets.max_cost, budgets.deadline, budgets.lost_after_s) == (
        5, 40.0, 1000.0 + 7200, 900.0)
    assert budgets.doctor is False
    assert budgets_of(job.recovery, max_recoveries=1, deadline="30m", now=0).deadline == 1800
    assert budgets_of(None).max_recoveries == 3 and budgets_of(None).deadline is None
    assert budgets_of(None).doctor is None  # on for every provider but local pods (hand_over)
    with pytest.raises(UserError, match="--deadline"):
        budgets_of(None, deadline="soon")
    job_file.write_text('command = "python train.py"\n[recovery]\nmax_recoverys = 5\n')
    with pytest.raises(UserError, match="max_recoverys"):
        load_job_file(job_file)


def test_a_managed_launch_that_could_not_be_recovered_is_refused_before_anything_starts(capsys):
    assert run(capsys, "create", "pod", "--type", "local-2x1")[0] == 0
    refusals = [
        (["--managed", "--on-end", "delete", "--", "true"], "--on-end delete"),
        (["--managed", "--worker", "0", "--", "true"], "leave out --worker"),
        (["--managed", "--config", str(CONFIG)], "needs checkpoints"),
        (["--managed", "--deadline", "later", "--", "true"], "--deadline"),
    ]
    for flags, said in refusals:
        status, _, err = run(capsys, "launch", "pod", *flags)
        assert status == 2 and said in err, (flags, err)
    assert not (worker_home(0) / "tpu-console" / "runs").exists()
