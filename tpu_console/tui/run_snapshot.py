"""What the run dashboard shows, as plain data, and the judgements made on it. Pure: no I/O, no Textual.

`RunFeed` fills these from the runs layer; the widgets only draw them, so every widget can be tested (and
snapshotted) with fixed data. The thresholds are nvitop's habit: a number is green while it is fine,
yellow when it deserves a look, red when it needs one.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tpu_console.runs.events import StepMetrics

# The phases of a GRPO step, in the order they run (`time/train/<phase>_s`); `step` is their total.
PHASES = ("rollout_generate", "reward", "advantages", "shard", "update", "step")

STRAGGLER_WARN = 1.2  # times the median of the other workers: worth a look
STRAGGLER_BAD = 1.5  # ... holding the whole pod back
HBM_WARN = 0.75  # fraction of the device limit
HBM_NEAR_LIMIT = 0.90
STALL_STEPS = 3.0  # a worker is stalled when its last step is older than this many recent step times
STALL_FLOOR_S = 60.0  # ... and at least this long (compiles and evals take a while)


@dataclass(frozen=True)
class WorkerRow:
    """One worker as last seen."""

    worker: int
    state: str  # pending, running, exited, lost
    step: int | None = None
    step_s: float | None = None
    exit_status: int | None = None
    last_line: str = ""
    failed: bool = False
    stalled_s: float | None = None  # seconds since its last step, when that counts as stalled
    reason: str | None = None  # why it is lost, or what went wrong reaching it
    error: str | None = None  # its error event's message
    mem_in_use_gib: float | None = None
    mem_peak_gib: float | None = None
    mem_limit_gib: float | None = None

    @property
    def stalled(self) -> bool:
        return self.stalled_s is not None


@dataclass(frozen=True)
class RunSnapshot:
    """The run as a whole at one moment."""

    run_id: str
    node: str
    state: str  # pending, running, succeeded, failed, stopped (runs.monitor.RunState)
    workers: tuple[WorkerRow, ...]
    updated_at: datetime
    failure: str | None = None  # "worker 1 exited 3: ..." while anything failed
    first_failure: int | None = None  # the worker that failed first
    ended: bool = False  # every worker's job is over: `state` is the verdict
    wandb_url: str | None = None
    problem: str | None = None  # why the run could not be read just now


@dataclass
class StepHistory:
    """Every step metric seen, per worker, for the breakdown and the plots. Bounded per worker."""

    max_steps: int = 5000
    by_worker: dict[int, dict[int, StepMetrics]] = field(default_factory=dict)

    def add(self, worker: int, steps: Iterable[StepMetrics]) -> bool:
        """Keep these steps; True when any was new."""
        known = self.by_worker.setdefault(worker, {})
        new = False
        for metrics in steps:
            new = new or metrics.step not in known
            known[metrics.step] = metrics
        while len(known) > self.max_steps:
            del known[min(known)]
        return new

    def latest(self, worker: int) -> StepMetrics | None:
        steps = self.by_worker.get(worker)
        return steps[max(steps)] if steps else None

    def latest_by_worker(self) -> dict[int, StepMetrics]:
        return {w: steps[max(steps)] for w, steps in self.by_worker.items() if steps}

    def series(self, value_of, worker: int | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of one worker, or the median over the workers that reported each step."""
        if worker is not None:
            steps = self.by_worker.get(worker, {})
            points = [(s, value_of(m)) for s, m in sorted(steps.items())]
            pairs = [(s, v) for s, v in points if v is not None]
        else:
            per_step: dict[int, list[float]] = {}
            for steps in self.by_worker.values():
                for s, m in steps.items():
                    if (v := value_of(m)) is not None:
                        per_step.setdefault(s, []).append(v)
            pairs = [(s, statistics.median(vs)) for s, vs in sorted(per_step.items())]
        return [s for s, _ in pairs], [v for _, v in pairs]


# -- judgements ----------------------------------------------------------------------------------------


def phase_seconds(metrics: StepMetrics, phase: str) -> float | None:
    return metrics.step_s if phase == "step" else metrics.phases.get(phase)


def slowness(values: Mapping[int, float]) -> dict[int, float]:
    """Each worker's value over the median of the *other* workers' (1.0 = typical). Needs two workers.

    Against the others, not everyone: with two workers, a median including the slow one would halve its
    lead. One sort for all workers (a 64-worker pod asks this for every phase of every step)."""
    if len(values) < 2:
        return {}
    ordered = sorted(values.values())
    count = len(ordered) - 1  # the others

    def others_at(position: int, left_out: int) -> float:  # the others, sorted, without `left_out`
        return ordered[position if position < left_out else position + 1]

    ratios = {}
    for worker, value in values.items():
        left_out = ordered.index(value)  # any equal value leaves the same others behind
        middle = count // 2
        if count % 2:
            median = others_at(middle, left_out)
        else:
            median = (others_at(middle - 1, left_out) + others_at(middle, left_out)) / 2
        if median > 0:
            ratios[worker] = value / median
    return ratios


def stragglers(values: Mapping[int, float], factor: float = STRAGGLER_WARN) -> dict[int, float]:
    """Workers at least `factor` times slower than the others, with how many times."""
    return {w: r for w, r in slowness(values).items() if r >= factor}


def slowness_level(ratio: float | None) -> str:
    if ratio is None or ratio < STRAGGLER_WARN:
        return "ok"
    return "warn" if ratio < STRAGGLER_BAD else "bad"


def memory_level(used_gib: float | None, limit_gib: float | None) -> str:
    """ok / warn / bad (near the limit), or unknown when the platform reports no memory."""
    if used_gib is None or not limit_gib:
        return "unknown"
    fraction = used_gib / limit_gib
    if fraction >= HBM_NEAR_LIMIT:
        return "bad"
    return "warn" if fraction >= HBM_WARN else "ok"


def stalled_for(last_progress_s: float | None, now_s: float, recent_step_s: float | None) -> float | None:
    """Seconds a running worker has gone without a new step, when that counts as a stall; else None.

    A stall is a last step older than STALL_STEPS recent step times, and STALL_FLOOR_S at least. Whether
    the others still progress (one worker stuck) or not (a hung collective stalls them all at once), the
    worker is shown as stalled."""
    if last_progress_s is None:
        return None
    silent = now_s - last_progress_s
    return silent if silent >= max(STALL_FLOOR_S, STALL_STEPS * (recent_step_s or 0.0)) else None
