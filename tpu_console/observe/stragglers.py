"""Which host slows the run: each worker's pace over its last steps, read from the step events every worker
writes (the trainer's own, or a foreign program's step lines turned into events by worker/step_lines.py).

Pure (no I/O). Per worker, over its last WINDOW steps (medians, so one checkpoint or eval step does not
count):

    step_s        the step time: the event's own figure (`time/train/step_s`), else the time between two
                  step events
    input_wait_s  the time between two step events that the step itself did not take (event gap minus its
                  step time): waiting for input, logging, anything outside the step; None without a step time
    lag_s         how long after the first worker it reaches each step (its event's time minus the earliest
                  worker's, for each step at least two workers reached)

A worker is named as a straggler when, with at least MIN_STEPS steps, its step time is FACTOR times the
median of the other workers' (and MIN_EXCESS_S more), or its input wait is, or it reaches steps later than
the others by half a median step and FACTOR times the others' median lag. The times are the workers' own
clocks (the events' `t`): on a pod, hosts kept within milliseconds by NTP.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

WINDOW = 20
MIN_STEPS = 5
FACTOR = 1.5
MIN_EXCESS_S = 0.05  # below this a difference is noise, whatever the ratio
LAG_SHARE = 0.5  # of the median step: a worker this far behind the first holds every collective up

# a worker's recent steps: step -> (the event's time, its step time or None)
Steps = Mapping[int, tuple[float, float | None]]


@dataclass(frozen=True)
class Pace:
    worker: int
    steps: int  # steps in its window
    step_s: float | None
    input_wait_s: float | None
    lag_s: float | None

    def to_json(self) -> dict:
        return {"worker": self.worker, "steps": self.steps, "step_s": self.step_s,
                "input_wait_s": self.input_wait_s, "lag_s": self.lag_s}


def paces(recent: Mapping[int, Steps], window: int = WINDOW) -> dict[int, Pace]:
    """Each worker's pace over its last `window` steps."""
    windows = {w: sorted(steps.items())[-window:] for w, steps in recent.items() if steps}
    reached: dict[int, list[float]] = {}
    for steps in windows.values():
        for step, (t, _) in steps:
            reached.setdefault(step, []).append(t)
    # when the first worker reached each step that more than one did (once per step: not per worker)
    first_at = {step: min(times) for step, times in reached.items() if len(times) > 1}
    out = {}
    for worker, steps in windows.items():
        times, waits, lags = [], [], []
        for (prev_step, (prev_t, _)), (step, (t, step_s)) in zip(steps, steps[1:], strict=False):
            gap = (t - prev_t) / max(1, step - prev_step)
            times.append(step_s if step_s is not None else gap)
            if step_s is not None and step == prev_step + 1:
                waits.append(max(0.0, gap - step_s))
        for step, (t, _) in steps:
            if step in first_at:
                lags.append(t - first_at[step])
        out[worker] = Pace(worker, len(steps), _median(times), _median(waits), _median(lags))
    return out


def stragglers(found: Mapping[int, Pace], window: int = WINDOW) -> dict[int, str]:
    """The workers that slow the run, each with one line: `worker 13: 1.8x the median step for the last 20
    steps (2.10s vs 1.17s)`."""
    ready = {w: p for w, p in found.items() if p.steps >= MIN_STEPS}
    if len(ready) < 2:
        return {}
    lines: dict[int, str] = {}
    step_median = _median([p.step_s for p in ready.values() if p.step_s is not None]) or 0.0
    # the others' medians from one sort per figure (a sort per worker was most of a 1,024-worker dashboard)
    step_refs, wait_refs, lag_refs = (
        _others(ready, figure) for figure in ("step_s", "input_wait_s", "lag_s"))
    for worker, pace in sorted(ready.items()):
        last = f"the last {min(window, pace.steps)} steps"
        step_ref, wait_ref, lag_ref = step_refs(worker), wait_refs(worker), lag_refs(worker)
        if _beyond(pace.step_s, step_ref):
            lines[worker] = (f"worker {worker}: {pace.step_s / step_ref:.1f}x the median step for {last} "
                             f"({pace.step_s:.2f}s vs {step_ref:.2f}s)")
        elif _beyond(pace.input_wait_s, wait_ref):
            lines[worker] = (f"worker {worker}: waits {pace.input_wait_s:.2f}s a step outside it (input) vs "
                             f"{wait_ref:.2f}s for the others over {last}")
        elif (pace.lag_s is not None and lag_ref is not None and pace.lag_s >= LAG_SHARE * step_median
              and pace.lag_s >= FACTOR * lag_ref and pace.lag_s - lag_ref >= MIN_EXCESS_S):
            lines[worker] = (f"worker {worker}: reaches each step {pace.lag_s:.2f}s after the first worker "
                             f"(the others {lag_ref:.2f}s) over {last}")
    return lines


def _others(ready: Mapping[int, Pace], figure: str):
    """worker -> the median of the other workers' `figure` (those that have one), or None."""
    values = {w: v for w, p in ready.items() if (v := getattr(p, figure)) is not None}
    medians = medians_of_the_others(values)
    everyone = _median(list(values.values()))  # a worker without the figure: every other worker's
    return lambda worker: medians.get(worker) if worker in values else everyone


def _beyond(value: float | None, reference: float | None) -> bool:
    return (value is not None and reference is not None and reference > 0 and value >= FACTOR * reference
            and value - reference >= MIN_EXCESS_S)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def medians_of_the_others(values: dict[int, float]) -> dict[int, float]:
    """For each worker, the median of every other worker's value (statistics.median of the rest), from one
    sort: O(n log n) rather than a sort per worker, which at 256 workers four times a second was most of
    the dashboard's time."""
    if len(values) < 2:
        return {}
    ordered = sorted(values.values())
    rest = len(ordered) - 1
    mid = rest // 2
    result = {}
    for worker, value in values.items():
        at = bisect.bisect_left(ordered, value)  # removing any copy of the value leaves the same rest

        def kept(k: int, at: int = at) -> float:  # the k-th of the rest, in order
            return ordered[k] if k < at else ordered[k + 1]

        result[worker] = kept(mid) if rest % 2 else (kept(mid - 1) + kept(mid)) / 2
    return result
