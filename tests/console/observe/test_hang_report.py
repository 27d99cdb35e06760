"""A hang made readable (observe/hang_report.py): the workers grouped by where their stacks stand, the ones
that never reached the collective the others wait in named; pure over faulthandler's dumps, then end to end: a
foreign program that hangs on a local pod, the supervisor's hang budget passed, `status` and `stacks` say who
never reached the collective."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.absent import PTRACE_FIX, absent
from tests.console.launch.test_local import pod, run  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.observe import health, supervision
from tpu_console.observe.hang_report import hang_line
from tpu_console.observe.stacks import WorkerStacks, group

HANG = str(Path(__file__).resolve().parent / "hang_job.py")
PY_SPY = Path(sys.prefix) / "bin" / "py-spy"


def dump(*frames: tuple[str, int, str]) -> str:
    """faulthandler's text for a main thread whose frames are given innermost first."""
    lines = ["Current thread 0x00007f0000000001 (most recent call first):"]
    lines += [f'  File "{path}", line {line} in {func}' for path, line, func in frames]
    return "\n".join(lines) + "\n"


WAITING = dump(("/usr/lib/python3.11/threading.py", 320, "wait"), ("/w/train.py", 12, "all_reduce"),
               ("/w/train.py", 30, "<module>"))
LOADING = dump(("/w/train.py", 20, "load_batch"), ("/w/train.py", 30, "<module>"))


def test_the_ones_that_never_reached_the_collective_are_named():
    found = group([WorkerStacks(0, WAITING), WorkerStacks(1, LOADING), WorkerStacks(2, WAITING),
                   WorkerStacks(3, WAITING), WorkerStacks(4, silent="stopped (SIGSTOP)")], "r", "pod")
    assert hang_line(found) == (
        "workers 0,2,3 wait in a collective at train.py:12 (all_reduce), inside threading.py:320 (wait); "
        "worker 1 never reached it: at train.py:20 (load_batch); worker 4 never reached it: did not answer "
        "(stopped (SIGSTOP))")


def test_a_larger_group_outside_a_collective_is_not_taken_for_the_waiters():
    found = group([WorkerStacks(0, LOADING), WorkerStacks(1, LOADING), WorkerStacks(2, WAITING)], "r", "p")
    assert hang_line(found).startswith("worker 2 wait in a collective at train.py:12 (all_reduce)")
    everyone = group([WorkerStacks(w, WAITING) for w in range(3)], "r", "p")
    assert hang_line(everyone) == ("every worker at train.py:12 (all_reduce), inside threading.py:320 (wait) "
                                   "(in a collective)")
    assert hang_line(group([], "r", "p")) is None


@pytest.mark.usefixtures("console_home", "pod")
def test_status_reads_a_hung_foreign_program_once_the_hang_budget_passed(capsys, monkeypatch):
    if not PY_SPY.exists():
        absent(f"py-spy is not installed at {PY_SPY}", "pip install py-spy, or scripts/test's dev extra")
    # a hang budget of seconds (the console ships its thresholds to the supervisor in the plan)
    monkeypatch.setattr(supervision, "Thresholds", lambda: health.Thresholds(stall_factor=2.0,
                                                                              stall_floor_s=2.0))
    status, out, err = run(capsys, "launch", "pod", "--json", "--", sys.executable, HANG, "3", "1")
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    view: dict = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not view.get("hang"):
        time.sleep(2)
        status, out, _ = run(capsys, "status", run_id, "--json")
        view = json.loads(out)
    try:
        if not view.get("hang") and any(d["decision"] == "silent" for d in view["supervisor"] or []):
            _, out, _ = run(capsys, "stacks", run_id, "--json")
            if "ermission" in out:
                absent("ptrace is refused here", PTRACE_FIX)
        # where worker 0 waits is py-spy's innermost frame (stacks.where); all_reduce puts it in a collective
        waits, _, late = view["hang"].partition("; ")
        assert waits.startswith("worker 0 wait in a collective at "), view["hang"]
        assert late.startswith("worker 1 never reached it: at ")
        assert late.endswith("hang_job.py:17 (load_batch)")
        status, out, _ = run(capsys, "status", run_id)
        assert f"hang: {view['hang']}" in out
        status, out, _ = run(capsys, "stacks", run_id)
        assert "\nhang: worker 0 wait in a collective" in out
    finally:
        run(capsys, "stop", run_id, "--yes")
