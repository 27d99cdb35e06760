"""Stragglers named from the step events: each worker's step time, input wait and lag over its last steps
(pure, with the trainer's events and with events made from a foreign program's step lines), then end to end:
a foreign program whose worker 1 steps slower, named by `status` (and --json) while it runs."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.console.launch.test_local import pod, run  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.history.events import EventSummary, parse_events
from tpu_console.observe.stragglers import Pace, paces, stragglers

PACED = str(Path(__file__).resolve().parent / "paced_job.py")


def trainer_events(worker: int, step_s: float, gap_s: float, steps: int = 25, late_s: float = 0.0) -> str:
    """events.jsonl as the trainer writes it: a step event every `gap_s`, its own step time `step_s`."""
    lines = [json.dumps({"t": 1000.0 + late_s + i * gap_s, "kind": "step", "process": worker, "step": i,
                         "time/train/step_s": step_s}) for i in range(1, steps + 1)]
    return "\n".join(lines) + "\n"


def recent(texts: dict[int, str]) -> dict[int, dict]:
    return {w: EventSummary().add(parse_events(text)).recent_steps for w, text in texts.items()}


def test_a_worker_with_a_slow_step_is_named_over_its_last_20_steps():
    texts = {w: trainer_events(w, 1.8 if w == 13 else 1.0, 2.0 if w == 13 else 1.1) for w in (11, 12, 13, 14)}
    found = paces(recent(texts))
    # further behind at each step: its lag grows
    assert found[13] == Pace(13, 20, 1.8, pytest.approx(0.2), pytest.approx(13.95))
    assert found[11].input_wait_s == pytest.approx(0.1)
    assert stragglers(found) == {13: "worker 13: 1.8x the median step for the last 20 steps (1.80s vs 1.00s)"}


def test_a_worker_waiting_for_input_is_named_by_its_wait():
    texts = {w: trainer_events(w, 1.0, 2.0 if w == 2 else 1.1) for w in range(4)}
    assert stragglers(paces(recent(texts))) == {
        2: "worker 2: waits 1.00s a step outside it (input) vs 0.10s for the others over the last 20 steps"}


def test_a_worker_that_reaches_every_step_late_is_named_by_its_lag():
    texts = {w: trainer_events(w, 1.0, 1.0, late_s=0.8 if w == 3 else 0.01 * w) for w in range(4)}
    lines = stragglers(paces(recent(texts)))
    assert list(lines) == [3]
    assert lines[3].startswith("worker 3: reaches each step 0.80s after the first worker")


def test_foreign_step_lines_time_their_steps_by_arrival():
    # a foreign program's events carry only the time each line arrived (worker/step_lines.py)
    texts = {w: "\n".join(json.dumps({"t": 500.0 + i * (3.0 if w == 0 else 1.0), "kind": "step", "step": i})
                          for i in range(1, 12)) for w in range(3)}
    found = paces(recent(texts))
    assert found[0].step_s == 3.0 and found[0].input_wait_s is None and found[1].step_s == 1.0
    assert stragglers(found) == {0: "worker 0: 3.0x the median step for the last 11 steps (3.00s vs 1.00s)"}


def test_even_workers_and_short_runs_name_nobody():
    even = {w: trainer_events(w, 1.0 + 0.05 * w, 1.1, late_s=0.01 * w) for w in range(8)}
    assert stragglers(paces(recent(even))) == {}
    short = {w: trainer_events(w, 5.0 if w == 0 else 1.0, 5.0 if w == 0 else 1.0, steps=4) for w in range(3)}
    assert stragglers(paces(recent(short))) == {}  # fewer than 5 steps: too early to say


@pytest.mark.usefixtures("console_home", "pod")
def test_status_names_the_slow_worker_of_a_foreign_program_while_it_runs(capsys):
    status, out, err = run(capsys, "launch", "pod", "--json", "--", sys.executable, PACED, "40", "0.2", "1",
                           "3")
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    deadline, view = time.monotonic() + 60, {}
    while time.monotonic() < deadline:
        time.sleep(2)
        status, out, _ = run(capsys, "status", run_id, "--json")
        view = json.loads(out)
        if view["stragglers"]:
            break
    assert view["stragglers"][0].startswith("worker 1: 3.0x the median step for the last ")
    pace = {p["worker"]: p for p in view["pace"]}
    assert pace[1]["step_s"] == pytest.approx(0.6, rel=0.3)
    assert pace[0]["step_s"] == pytest.approx(0.2, rel=0.3)
    status, out, _ = run(capsys, "status", run_id)
    assert "straggler: worker 1: " in out
    run(capsys, "stop", run_id, "--yes")


@pytest.mark.usefixtures("console_home", "pod")
def test_the_supervisor_reports_the_straggler_it_was_asked_to_watch_for(capsys):
    status, out, err = run(capsys, "launch", "pod", "--json", "--on-straggler", "report", "--",
                           sys.executable, PACED, "100", "0.2", "1", "3")
    assert status == 0, err
    assert "on a straggler: report" in err  # said at launch, with the rest of the policy
    run_id = json.loads(out)["run_id"]
    deadline, said = time.monotonic() + 90, []
    while time.monotonic() < deadline and not said:
        time.sleep(2)
        status, out, _ = run(capsys, "status", run_id, "--json")
        said = [d for d in json.loads(out)["supervisor"] or [] if d["decision"] == "straggler"]
    assert said and said[0]["worker"] == 1 and said[0]["action"] == "report"
    assert said[0]["message"].startswith("worker 1: ") and said[0]["message"].endswith(": reported")
    assert "x the median step for the last " in said[0]["message"]
    run(capsys, "stop", run_id, "--yes")
