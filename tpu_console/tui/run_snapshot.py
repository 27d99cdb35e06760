"""What the run dashboard shows, as plain data. Pure: no I/O, no Textual.

`RunFeed` fills these from the run's `RunWatch`; the widgets only draw them, so every widget can be tested
(and snapshotted) with fixed data. The judgements on a worker (stalled, hung after a failure, straggler)
are the watcher's own (`tpu_console.observe.health`), carried here as they were made; what is left in this
module is arithmetic for drawing: ratios to the other workers, memory levels, series for the plots. The
colours are nvitop's habit: a number is green while it is fine, yellow when it deserves a look, red when
it needs one.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from tpu_console.history.events import StepMetrics

if TYPE_CHECKING:
    from tpu_console.history.goodput import Goodput
    from tpu_console.observe.device_metrics import WorkerDeviceMetrics

# The phases of a GRPO step, in the order they run (`time/train/<phase>_s`); `step` is their total.
PHASES = ("rollout_generate", "reward", "advantages", "shard", "update", "step")

HBM_WARN = 0.75  # fraction of the device limit
HBM_NEAR_LIMIT = 0.90


@dataclass(frozen=True)
class WorkerRow:
    """One worker as last seen: the watcher's health of it, and what its files said last."""

    worker: int
    activity: str  # runs.health.Activity: starting, compiling, running, stalled, exited, stopped, lost ...
    for_s: float = 0.0  # how long it has been in this activity, as the console saw it
    step: int | None = None
    step_s: float | None = None
    exit_status: int | None = None
    last_line: str = ""
    failed: bool = False  # exited non-zero, or lost
    stopped: bool = False  # ended by a stop the console asked for: not a failure
    step_age_s: float | None = None  # since its last step arrived (while running or stalled)
    hung: bool = False  # still running after another worker failed: likely stuck in a collective
    straggler: str | None = None  # the watcher's finding, e.g. "rollout_generate 4.1s vs median 2.0s (2.0x)"
    reason: str | None = None  # why it is lost or unreachable
    error: str | None = None  # its error event's message
    # what its log says went wrong (a log signature, with the fix): OOM, TPU in use ...
    problem: str | None = None
    problem_kind: str | None = None  # runs.signatures kind of `problem`: oom, tpu_in_use, exception ...
    traceback: str | None = None  # its log's last Python traceback, whole (`enter` shows it)
    mem_in_use_gib: float | None = None
    mem_peak_gib: float | None = None
    mem_limit_gib: float | None = None
    slice: int | None = None  # its slice, on a multislice run

    @property
    def stalled(self) -> bool:
        return self.activity == "stalled"


@dataclass(frozen=True)
class RunSnapshot:
    """The run as a whole at one moment."""

    run_id: str
    node: str
    state: str  # runs.monitor.RunState: pending, running, partially-dead, succeeded, failed, stopped
    workers: tuple[WorkerRow, ...]
    updated_at: datetime
    failure: str | None = None  # "worker 1 exited 3: ..." while anything failed
    first_failure: int | None = None  # the worker that failed first
    ended: bool = False  # every worker's job is over: `state` is the verdict
    wandb_url: str | None = None
    hung: tuple[int, ...] = ()  # alive after another worker failed: the run should be stopped (`x`)
    stalled: tuple[int, ...] = ()
    all_silent: bool = False  # every running worker is stalled: the whole job looks hung
    stragglers: tuple[int, ...] = ()
    node_warning: str | None = None  # the node is unhealthy, has symptoms, or has maintenance in the run
    goodput: Goodput | None = None  # the run's time: productive steps and badput (history/goodput.py)
    steps_note: str | None = None  # a command job's: where its steps come from, or that none matched

    def row(self, worker: int) -> WorkerRow | None:
        return next((w for w in self.workers if w.worker == worker), None)


@dataclass(frozen=True)
class DeviceReadings:
    """libtpu's live metrics of each worker's devices (observe/device_metrics.py), as last read: they come
    from the TPU runtime itself, so they show even while the trainer hangs."""

    by_worker: dict[int, WorkerDeviceMetrics] = field(default_factory=dict)
    problem: str | None = None  # why nothing could be read (the run has ended, the node is unreachable ...)


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


# -- arithmetic for drawing -----------------------------------------------------------------------------


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


def memory_level(used_gib: float | None, limit_gib: float | None) -> str:
    """ok / warn / bad (near the limit), or unknown when the platform reports no memory."""
    return fraction_level(None if used_gib is None or not limit_gib else used_gib / limit_gib)


def fraction_level(fraction: float | None) -> str:
    """The level of a fraction of the device memory limit; unknown for None."""
    if fraction is None:
        return "unknown"
    if fraction >= HBM_NEAR_LIMIT:
        return "bad"
    return "warn" if fraction >= HBM_WARN else "ok"
