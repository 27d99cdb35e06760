"""`status` on a large run: the workers counted by state, only the odd ones out listed."""

from __future__ import annotations

from tpu_console.observe.monitor import WorkerState, WorkerStatus
from tpu_console.views.runs import MAX_LISTED, worker_ranges, worker_summary


def running(worker: int) -> WorkerStatus:
    return WorkerStatus(worker, WorkerState.RUNNING)


def test_counts_by_state_and_lists_the_odd_ones_out():
    statuses = [running(w) for w in range(256)]
    statuses[17] = WorkerStatus(17, WorkerState.EXITED, exit_status=1)
    statuses[40] = WorkerStatus(40, WorkerState.LOST, reason="its job is gone")
    statuses[41] = WorkerStatus(41, WorkerState.RUNNING, unreachable_probes=2, reason="no route")
    statuses[200] = WorkerStatus(200, WorkerState.PENDING)
    counts, listed = worker_summary(statuses)
    assert counts[0].split() == ["running", "252", "workers", "0-16,18-39,42-199,201-255"]
    assert sorted(line.split()[0] for line in counts[1:]) == ["failed", "lost", "pending", "unreachable"]
    assert [s.worker for s in listed] == [17, 40, 41, 200]


def test_at_most_max_listed_the_worst_first():
    statuses = [running(w) for w in range(64)]
    for w in range(30, 60):
        statuses[w] = WorkerStatus(w, WorkerState.PENDING)  # a rare state, but 30 of them
    statuses[63] = WorkerStatus(63, WorkerState.EXITED, exit_status=2)
    counts, listed = worker_summary(statuses)
    assert len(listed) == MAX_LISTED and 63 in [s.worker for s in listed]
    assert [line.split()[:2] for line in counts] == [["running", "33"], ["pending", "30"], ["failed", "1"]]


def test_worker_ranges():
    assert worker_ranges([5, 0, 1, 2, 7, 8, 10]) == "0-2,5,7-8,10"
    assert worker_ranges([]) == ""
