"""The supervisor's `on_straggler` on a fake clock: a worker whose recent step time is 1.5x the others' median
is named once an attempt in supervisor.jsonl (report), or every job is restarted from its checkpoint up to
max_restarts (restart); even workers name nobody; without the option nothing is judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.console.worker.test_supervisor import Clock, make, start_all, stopped
from tpu_console.errors import UserError
from tpu_console.observe import supervision
from tpu_console.worker import supervisor as sv


def steps(s: sv.Supervisor, clock: Clock, seconds: int, slow: dict[int, float]) -> None:
    """`seconds` pass, a heartbeat a second from each worker: its step (one every `slow[w]` s, else every
    second) and its own step time."""
    for second in range(1, seconds + 1):
        clock.t += 1
        for w in s.workers:
            pace = slow.get(w, 1.0)
            s.report({"worker": w, "event": "heartbeat", "attempt": s.attempt, "step": int(second // pace),
                      "step_s": pace})
        s.tick()


def decisions(s: sv.Supervisor) -> list[str]:
    path = Path(s.folder) / "supervisor.jsonl"
    return [d.message for d in supervision.parse_decisions(path.read_text())] if path.exists() else []


def test_a_straggler_is_reported_once_an_attempt(tmp_path):
    s, clock = make(tmp_path, workers=(0, 1, 2), on_straggler="report")
    start_all(s)
    steps(s, clock, 30, {2: 2.0})
    said = [m for m in decisions(s) if m.startswith("worker 2:")]
    # named as soon as it has 5 steps, and once
    assert said == ["worker 2: 2.0x the median step for the last 5 steps (2.00s vs 1.00s): reported"]
    assert s.restart_pending is None and s.stopping is None


def test_a_straggler_restarts_every_job_within_max_restarts(tmp_path):
    s, clock = make(tmp_path, workers=(0, 1, 2), on_straggler="restart", max_restarts=1)
    start_all(s)
    steps(s, clock, 12, {1: 3.0})
    assert s.restart_pending == "straggler"
    assert decisions(s)[-1].startswith("worker 1: 3.0x the median step for the last ")
    assert decisions(s)[-1].endswith("restarting every job from its latest checkpoint (straggler restart 1 "
                                     "of 1)")
    for w in s.workers:
        assert s.report({"worker": w, "event": "heartbeat", "attempt": s.attempt})["order"] == "stop"
        stopped(s, w)
    s.tick()
    orders = [s.report({"worker": w, "event": "poll", "attempt": s.attempt - 1}) for w in s.workers]
    assert [o["order"] for o in orders] == ["restart"] * 3 and s.restarts == {"straggler": 1}
    start_all(s)
    steps(s, clock, 20, {1: 3.0})  # still slow after the restart: no restart left, said so
    assert decisions(s)[-1].endswith("no straggler restart left (1 of 1 used)") and s.restart_pending is None


def test_even_workers_or_no_option_name_nobody(tmp_path):
    s, clock = make(tmp_path, workers=(0, 1, 2, 3), on_straggler="report")
    start_all(s)
    steps(s, clock, 30, {3: 1.2})
    assert not any("median step" in m for m in decisions(s))
    s2, clock2 = make(tmp_path / "b", workers=(0, 1, 2))
    start_all(s2)
    steps(s2, clock2, 30, {2: 3.0})
    assert not any("median step" in m for m in decisions(s2))


def test_a_bad_on_straggler_is_refused_in_one_line():
    with pytest.raises(UserError, match="--on-straggler 'kill': choose report or restart"):
        supervision.policy_from_options(on_straggler="kill")
