"""Judgements on a live run, on top of `RunMonitor`'s per-worker states. Pure: no I/O; time is passed in.

Per worker, an *activity* a person can read at a glance, with how long it has lasted:

    starting      the job runs but the trainer has not written its `start` event yet (imports,
    jax.distributed)
    compiling     started, no step finished yet (the first step compiles)
    running       at step N
    stalled       its last step is older than `stall_factor` x its recent step time (and `stall_floor_s`)
    exited        with its exit status
    stopped       ended by a stop the console asked for (whatever its exit status)
    lost          the job is gone without an exit status, or the node is gone
    unreachable   the last probe could not reach the worker (may come back)

And for the run: `hung` workers (one worker failed while these still run: in a multi-host job they wait
forever in a collective, holding the TPU), `all_silent` (every running worker stalled: the job as a whole
hangs), and `stragglers` (a worker whose step or phase time is much slower than the others' median).

The times compared are the console's own clock (when it *saw* a step arrive), never the workers' clocks,
so clock skew between hosts does not matter.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tpu_console.observe.monitor import RunMonitor, WorkerState, WorkerStatus
from tpu_console.observe.stragglers import medians_of_the_others, paces
from tpu_console.observe.stragglers import stragglers as stragglers_by_pace


class Activity(enum.StrEnum):
    STARTING = "starting"
    COMPILING = "compiling"
    RUNNING = "running"
    STALLED = "stalled"
    EXITED = "exited"
    STOPPED = "stopped"
    LOST = "lost"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Thresholds:
    stall_factor: float = 3.0  # a worker is stalled when its last step is older than this many step times
    stall_floor_s: float = 60.0  # ... and at least this old (evals and checkpoints take a while)
    silent_s: float = 1800.0  # no step at all yet (compiling) for this long, on every worker: the job hangs
    straggler_factor: float = 1.5  # step or phase time this many times the others' median
    straggler_min_s: float = 0.05  # phases shorter than this are noise, never stragglers


@dataclass
class Progress:
    """What the console saw of one worker over time (fed by the watcher)."""

    first_seen_at: float | None = None  # when the job was first seen running
    activity: Activity | None = None
    activity_since: float | None = None
    last_step: int | None = None
    last_step_seen_at: float | None = None  # when a new step number arrived

    def saw_step(self, step: int | None, now: float) -> None:
        if step is not None and step != self.last_step:
            self.last_step, self.last_step_seen_at = step, now


@dataclass(frozen=True)
class WorkerHealth:
    worker: int
    activity: Activity
    for_s: float  # how long it has been in this activity (as seen by the console)
    step: int | None = None
    exit_status: int | None = None
    step_age_s: float | None = None  # since its last step arrived
    hung: bool = False  # still running after another worker failed
    straggler: str | None = None  # "step 2.10s vs median 1.00s (2.1x)"
    reason: str | None = None  # why lost / unreachable

    @property
    def label(self) -> str:
        """`running at step 12`, `exited(3)`, `stalled at step 4 for 5m`, ..."""
        if self.activity is Activity.EXITED:
            return f"exited({self.exit_status})"
        text = str(self.activity)
        if self.activity in (Activity.RUNNING, Activity.STALLED) and self.step is not None:
            text += f" at step {self.step}"
        if self.hung:
            text += ", hung"
        return text


@dataclass(frozen=True)
class RunHealth:
    state: str  # the monitor's RunState
    workers: dict[int, WorkerHealth] = field(default_factory=dict)
    first_failure: int | None = None
    failure: str | None = None
    hung: tuple[int, ...] = ()  # alive after another worker failed: offer to stop them
    stalled: tuple[int, ...] = ()
    all_silent: bool = False  # every running worker stalled
    stragglers: tuple[int, ...] = ()

    @property
    def verdict(self) -> str:
        """One line for the run: its state and what deserves attention."""
        parts = [self.state]
        if self.failure:
            parts.append(f"first failure: {self.failure}")
        if self.hung:
            parts.append(
                f"worker(s) {_join(self.hung)} still running after that failure (likely hung in a "
                "collective): stop them"
            )
        if self.all_silent:
            parts.append("every running worker is silent: the job looks hung")
        elif self.stalled:
            parts.append(f"worker(s) {_join(self.stalled)} stalled while others progress")
        if self.stragglers:
            parts.append(f"straggler(s): {_join(self.stragglers)}")
        return "; ".join(parts)


def assess(
    monitor: RunMonitor, progress: dict[int, Progress], now: float, thresholds: Thresholds = Thresholds()
) -> RunHealth:
    """The run's health at `now`. Updates each worker's `Progress` (its activity and since when)."""
    statuses = monitor.workers
    for worker, status in statuses.items():
        p = progress.setdefault(worker, Progress())
        if status.state is WorkerState.RUNNING and p.first_seen_at is None:
            p.first_seen_at = now
        p.saw_step(status.events.last_step.step if status.events.last_step else None, now)

    failed = [s for s in statuses.values() if s.failed]
    hung = tuple(sorted(w for w, s in statuses.items() if failed and s.state is WorkerState.RUNNING))
    hung_set = set(hung)  # asked once per worker below
    stragglers = _stragglers(statuses, thresholds)
    workers: dict[int, WorkerHealth] = {}
    for worker, status in statuses.items():
        p = progress[worker]
        activity, step_age = _activity(status, p, now, thresholds)
        if activity is not p.activity:
            p.activity, p.activity_since = activity, now
        last = status.events.last_step
        workers[worker] = WorkerHealth(
            worker=worker,
            activity=activity,
            for_s=now - (p.activity_since if p.activity_since is not None else now),
            step=last.step if last else None,
            exit_status=status.exit_status,
            step_age_s=step_age,
            hung=worker in hung_set,
            straggler=stragglers.get(worker),
            reason=status.reason if activity in (Activity.LOST, Activity.UNREACHABLE) else None,
        )
    running = [h for h in workers.values() if h.activity in (Activity.RUNNING, Activity.STALLED)]
    stalled = tuple(sorted(h.worker for h in running if h.activity is Activity.STALLED))
    compiling = [h for h in workers.values() if h.activity is Activity.COMPILING]
    silent_compile = bool(compiling) and all(h.for_s > thresholds.silent_s for h in compiling) and not running
    first = monitor.first_failure()
    return RunHealth(
        state=str(monitor.state),
        workers=workers,
        first_failure=first.worker if first else None,
        failure=monitor.failure_message(),
        hung=hung,
        stalled=stalled,
        all_silent=(bool(running) and len(stalled) == len(running)) or silent_compile,
        stragglers=tuple(sorted(stragglers)),
    )


def _activity(status: WorkerStatus, p: Progress, now: float, t: Thresholds) -> tuple[Activity, float | None]:
    if status.stopped:
        return Activity.STOPPED, None
    if status.state is WorkerState.EXITED:
        return Activity.EXITED, None
    if status.unreachable_probes > 0:
        return Activity.UNREACHABLE, None
    if status.state is WorkerState.LOST:
        return Activity.LOST, None
    if status.state is WorkerState.PENDING or status.events.start is None and status.events.last_step is None:
        return Activity.STARTING, None
    last = status.events.last_step
    if last is None:
        return Activity.COMPILING, None
    step_age = now - (p.last_step_seen_at if p.last_step_seen_at is not None else now)
    recent = last.step_avg_last10_s or last.step_s or 0.0
    if step_age > max(t.stall_floor_s, t.stall_factor * recent):
        return Activity.STALLED, step_age
    return Activity.RUNNING, step_age


def _stragglers(statuses: dict[int, WorkerStatus], t: Thresholds) -> dict[int, str]:
    """Workers whose pace over their last steps names them (observe/stragglers.py), then those whose last
    step time, or one phase's time, is `straggler_factor` x the others' median."""
    steps = {
        w: s.events.last_step
        for w, s in statuses.items()
        if s.state is WorkerState.RUNNING and s.events.last_step is not None
    }
    if len(steps) < 2:
        return {}
    found = pace_stragglers({w: statuses[w].events.recent_steps for w in steps})
    timings: dict[str, dict[int, float]] = {"step": {}}
    for worker, last in steps.items():
        if last.step_s is not None:
            timings["step"][worker] = last.step_s
        for phase, seconds in last.phases.items():
            if phase != "step":
                timings.setdefault(phase, {})[worker] = seconds
    for name, values in timings.items():
        medians = medians_of_the_others(values)
        for worker, seconds in values.items():
            if worker in found or len(values) < 2 or seconds < t.straggler_min_s:
                continue
            median = medians[worker]
            if median > 0 and seconds >= t.straggler_factor * median:
                found[worker] = f"{name} {seconds:.2f}s vs median {median:.2f}s ({seconds / median:.1f}x)"
    return found


def pace_stragglers(recent: dict[int, dict[int, tuple[float, float | None]]]) -> dict[int, str]:
    """observe/stragglers.py's lines over the workers' recent steps, without their "worker N: " (a worker's
    finding is shown beside it): "1.8x the median step for the last 20 steps (2.10s vs 1.17s)"."""
    return {w: line.partition(": ")[2] for w, line in stragglers_by_pace(paces(recent)).items()}


def _join(workers: tuple[int, ...]) -> str:
    return ",".join(str(w) for w in workers)
