"""The state of a run, worker by worker, from status probes and events. Pure: no I/O here.

Each worker moves pending -> running -> exited(status), or to lost when its job vanished without an exit
status (the wrapper was killed, the host restarted or was preempted, the run folder is gone) or the worker
stayed unreachable for `lost_after_unreachable` probes in a row. Exited is final; lost because unreachable
is not (the worker may answer again).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from tpu_console.history.events import EventSummary
from tpu_console.observe.probe import RunProbe


class WorkerState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"


class RunState(enum.StrEnum):
    PENDING = "pending"  # no worker has started its job yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # every worker exited 0
    FAILED = "failed"  # a worker exited non-zero or was lost, and every worker has ended
    # A worker failed while others still run: in a multi-host job they usually hang in a collective
    # waiting for it, holding the TPU until stopped.
    PARTIALLY_DEAD = "partially-dead"
    STOPPED = "stopped"  # stopped on request, and no worker is still running


@dataclass
class WorkerStatus:
    worker: int
    state: WorkerState = WorkerState.PENDING
    exit_status: int | None = None
    exit_time: float | None = None
    pgid: int | None = None
    reason: str | None = None  # why it is lost, or the last probe problem
    unreachable_probes: int = 0
    log_bytes: int = 0
    events_bytes: int = 0
    events: EventSummary = field(default_factory=EventSummary)
    log_tail: list[str] = field(default_factory=list)
    stopped: bool = False  # it ended after the console asked the run to stop: not a failure

    @property
    def failed(self) -> bool:
        if self.stopped:
            return False
        return self.state is WorkerState.LOST or (self.state is WorkerState.EXITED and self.exit_status != 0)

    @property
    def done(self) -> bool:
        return self.state in (WorkerState.EXITED, WorkerState.LOST)

    @property
    def failed_at(self) -> float:
        """When it failed, for ordering failures: exit file time, else its error event, else unknown."""
        if self.exit_time is not None:
            return self.exit_time
        if self.events.error is not None and self.events.error.t is not None:
            return self.events.error.t
        return math.inf


class RunMonitor:
    def __init__(self, run_id: str, workers: Sequence[int], lost_after_unreachable: int = 3) -> None:
        self.run_id = run_id
        self.workers = {w: WorkerStatus(w) for w in workers}
        self.lost_after_unreachable = max(1, lost_after_unreachable)
        self.stop_requested = False
        # When the stop was asked for (unix s), where known: a worker that ended before it had failed on
        # its own. Unknown: every worker that ended is taken as stopped.
        self.stop_requested_at: float | None = None

    def observe(self, worker: int, probe: RunProbe) -> WorkerStatus:
        """Feed one probe of this worker (the events in it are added to its summary)."""
        status = self._observe(self.workers[worker], probe)
        self._settle(status)  # this worker only: per probe, the whole run would make a round O(workers^2)
        return status

    def _observe(self, status: WorkerStatus, probe: RunProbe) -> WorkerStatus:
        status.unreachable_probes = 0
        status.events.add(probe.events)
        if probe.log_tail:
            status.log_tail = list(probe.log_tail)
        if status.state is WorkerState.EXITED:
            if status.exit_time is None:  # ended before this monitor was made (read from the history)
                status.exit_time = probe.exit_time
            return status
        if probe.missing:
            return self._lose(status, "its run folder is missing on the worker")
        status.pgid = probe.pgid if probe.pgid is not None else status.pgid
        status.log_bytes, status.events_bytes = probe.log_bytes, probe.events_bytes
        if probe.exit_status is not None:
            status.state, status.reason = WorkerState.EXITED, None
            status.exit_status, status.exit_time = probe.exit_status, probe.exit_time
        elif probe.alive:
            status.state, status.reason = WorkerState.RUNNING, None
        elif probe.pgid is not None:
            self._lose(status, "its job is gone without an exit status (killed with its wrapper, or the "
                       "host restarted)")
        return status

    def observe_unreachable(self, worker: int, error: str) -> WorkerStatus:
        status = self.workers[worker]
        status.unreachable_probes += 1
        status.reason = error
        if not status.done and status.unreachable_probes >= self.lost_after_unreachable:
            status.state = WorkerState.LOST
        self._settle(status)
        return status

    def _lose(self, status: WorkerStatus, reason: str) -> WorkerStatus:
        status.state, status.reason = WorkerState.LOST, reason
        return status

    # -- the run as a whole ----------------------------------------------------------------------------

    def note_stop(self, requested_at: datetime | None) -> None:
        """The run's stop request as the history has it (None: none was made)."""
        self.stop_requested = requested_at is not None
        self.stop_requested_at = requested_at.timestamp() if requested_at is not None else None
        self._settle_stopped()

    @property
    def all_done(self) -> bool:
        return all(s.done for s in self.workers.values())

    def _settle_stopped(self) -> None:
        """Mark the workers whose end the stop caused, so a stop the user asked for is no failure."""
        for status in self.workers.values():
            self._settle(status)

    def _settle(self, status: WorkerStatus) -> None:
        status.stopped = self.stop_requested and status.done and self._ended_after_stop(status)

    def _ended_after_stop(self, status: WorkerStatus) -> bool:
        if self.stop_requested_at is None or status.exit_time is None:
            return True
        return status.exit_time >= self.stop_requested_at - 1.0  # the worker's clock against ours

    @property
    def state(self) -> RunState:
        self._settle_stopped()
        statuses = list(self.workers.values())
        if self.stop_requested and self.all_done:
            return RunState.STOPPED
        if any(s.failed for s in statuses):
            return RunState.FAILED if self.all_done else RunState.PARTIALLY_DEAD
        if statuses and all(s.state is WorkerState.EXITED for s in statuses):
            return RunState.SUCCEEDED
        if all(s.state is WorkerState.PENDING for s in statuses):
            return RunState.PENDING
        return RunState.RUNNING

    def first_failure(self) -> WorkerStatus | None:
        """The worker that failed first (the likely cause; the others often die waiting on it)."""
        self._settle_stopped()
        failed = [s for s in self.workers.values() if s.failed]
        return min(failed, key=lambda s: (s.failed_at, s.worker)) if failed else None

    def still_running(self) -> list[int]:
        return [s.worker for s in self.workers.values() if not s.done]

    def failure_message(self) -> str | None:
        """`worker 1 exited 1: <its error event message>`, or None while nothing failed."""
        first = self.first_failure()
        if first is None:
            return None
        if first.state is WorkerState.LOST:
            return f"worker {first.worker} lost: {first.reason}"
        detail = first.events.error_message or (first.log_tail[-1] if first.log_tail else None)
        return f"worker {first.worker} exited {first.exit_status}" + (f": {detail}" if detail else "")
