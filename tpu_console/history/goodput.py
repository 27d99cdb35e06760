"""Goodput of a run: its time split into productive step time and badput, by cause. Pure: no I/O.

The definitions are those of Google's ml-goodput-measurement library (AI-Hypercomputer/ml-goodput-measurement,
docs/runs.md#goodput), computed from what the console and the run's supervisor record instead of from calls
the program makes, so it works for a program that knows nothing of tpu-console:

- productive: the time between consecutive steps, kept only while the step's progress was kept;
- start-up (the library's PROGRAM_STARTUP, with TPU_INITIALIZATION and TRAINING_PREP, which a program that
  does not record them cannot tell apart): from the job's start (launch, or a restart) to its first step,
  less one typical step (the mean of the other steps' times, as the library takes it);
- lost to restarts (WASTED_PROGRESS_FROM_DISRUPTION): from the last step a restart kept (the step the job
  resumed after) to the restart: steps done again, and the time the failure took to be acted on;
- other (OTHER): after the last step until the job ended (a final save, teardown), and a live run's wait
  for its next step beyond one typical step;
- before the job, the console's own: provisioning (creating the node), setup (bootstrap, sync and setup on
  the node), and idle (time between them, and before the launch, with nothing happening on the node).

A run's time starts at the first thing done on its node for it: the node's creation, bootstrap, sync or
setup after the previous run on the node ended (or, with none recorded, the launch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

PRODUCTIVE = "productive"
PROVISIONING = "provisioning"
SETUP = "setup"
STARTUP = "startup"
LOST = "lost_to_restarts"
PREEMPTED = "lost_to_preemptions"
IDLE = "idle"
OTHER = "other"
BADPUT = (PROVISIONING, SETUP, STARTUP, LOST, PREEMPTED, IDLE, OTHER)  # in the order a run lives them
LABELS = {
    PRODUCTIVE: "productive steps",
    PROVISIONING: "provisioning",
    SETUP: "setup (bootstrap, sync, setup)",
    STARTUP: "program start-up",
    LOST: "lost to restarts",
    PREEMPTED: "lost to preemptions (steps redone, node made again)",
    IDLE: "idle",
    OTHER: "other (after the last step)",
}
# What each kind of node preparation counts as.
PREP_CATEGORY = {"create": PROVISIONING, "bootstrap": SETUP, "sync": SETUP, "setup": SETUP}


@dataclass(frozen=True)
class Span:
    """Something done on the node before a run: `kind` is create, bootstrap, sync or setup."""

    kind: str
    start: float  # unix seconds
    end: float


@dataclass(frozen=True)
class StepMark:
    step: int
    t: float  # unix seconds when the step was reported done
    step_s: float | None = None  # the step's own time, where the program reports it


@dataclass
class Timeline:
    """What is known of one run, in unix seconds."""

    launched_at: float
    steps: Sequence[StepMark] = ()  # one worker's steps, in the order reported
    restarts: Sequence[float] = ()  # when the supervisor started the job again
    recovered: Sequence[float] = ()  # those of `restarts` that relaunched a managed run after a preemption
    prep: Sequence[Span] = ()  # the node's preparation that belongs to this run
    ended_at: float | None = None  # None: the run is still going (then `now` ends it)
    now: float | None = None


@dataclass(frozen=True)
class Goodput:
    total_s: float
    seconds: dict[str, float] = field(default_factory=dict)  # PRODUCTIVE and every BADPUT key
    steps: int = 0  # steps whose progress was kept
    typical_step_s: float | None = None
    restarts: int = 0
    live: bool = False

    @property
    def productive_s(self) -> float:
        return self.seconds.get(PRODUCTIVE, 0.0)

    def percent(self, key: str = PRODUCTIVE) -> float | None:
        return None if self.total_s <= 0 else 100.0 * self.seconds.get(key, 0.0) / self.total_s

    def to_json(self) -> dict[str, Any]:
        return {
            "goodput_pct": _round(self.percent()),
            "total_s": round(self.total_s, 3),
            "productive_s": round(self.productive_s, 3),
            "badput_s": {key: round(self.seconds.get(key, 0.0), 3) for key in BADPUT},
            "badput_pct": {key: _round(self.percent(key)) for key in BADPUT},
            "steps": self.steps,
            "typical_step_s": _round(self.typical_step_s),
            "restarts": self.restarts,
            "live": self.live,
        }

    def line(self) -> str:
        """One line: the goodput and the badput that is there, largest first."""
        pct = self.percent()
        if pct is None:
            return "goodput: no time yet"
        parts = [f"goodput {pct:.1f}% of {format_seconds(self.total_s)}"]
        for key in sorted(BADPUT, key=lambda k: -self.seconds.get(k, 0.0)):
            share = self.percent(key) or 0.0
            if share >= 0.05:
                parts.append(f"{LABELS[key].split(' (')[0]} {share:.1f}%")
        return " · ".join(parts)

    def rows(self) -> list[tuple[str, str, str]]:
        """(what, time, share) for a table: productive first, then each badput."""
        return [(LABELS[key], format_seconds(self.seconds.get(key, 0.0)), _pct(self.percent(key)))
                for key in (PRODUCTIVE, *BADPUT)]


def goodput(timeline: Timeline) -> Goodput:
    """Split the run's time (see the module's docstring) so that the parts add up to the whole."""
    end = timeline.ended_at if timeline.ended_at is not None else timeline.now
    if end is None:
        raise ValueError("a run still going needs `now`")
    launched = timeline.launched_at
    seconds = dict.fromkeys((PRODUCTIVE, *BADPUT), 0.0)
    start = _before_launch(timeline.prep, launched, seconds)
    attempts = _attempts(launched, sorted(r for r in timeline.restarts if launched <= r <= end), end)
    marks = _by_attempt(timeline.steps, attempts)
    typical = _typical_step(marks, timeline.steps)
    kept_steps = 0
    recovered = set(timeline.recovered)
    for index, ((begin, finish), steps) in enumerate(zip(attempts, marks, strict=True)):
        last_attempt = index == len(attempts) - 1
        # what a preemption cost (the steps done again, the time until the relaunch) has its own bucket
        lost = PREEMPTED if not last_attempt and attempts[index + 1][0] in recovered else LOST
        if not steps:  # it never made a step: all of it was starting up (or lost to a preemption)
            seconds[PREEMPTED if lost == PREEMPTED else STARTUP] += finish - begin
            continue
        redone = min((s.step for later in marks[index + 1:] for s in later), default=None)
        previous_t = begin
        for position, mark in enumerate(steps):
            t = min(max(mark.t, previous_t), finish)
            span = t - previous_t
            if position == 0:
                startup = max(0.0, span - (typical or 0.0))
                seconds[STARTUP] += startup
                span -= startup
            kept = redone is None or mark.step < redone
            seconds[PRODUCTIVE if kept else lost] += span
            kept_steps += kept
            previous_t = t
        tail = finish - previous_t
        if not last_attempt:
            seconds[lost] += tail  # the job was failing or waiting for the restart
        elif timeline.ended_at is None:  # a step under way, then waiting for it
            in_progress = min(tail, typical or 0.0)
            seconds[PRODUCTIVE] += in_progress
            seconds[OTHER] += tail - in_progress
        else:
            seconds[OTHER] += tail
    return Goodput(
        total_s=max(0.0, end - start), seconds=seconds, steps=kept_steps, typical_step_s=typical,
        restarts=len(attempts) - 1, live=timeline.ended_at is None,
    )


def _before_launch(prep: Iterable[Span], launched: float, seconds: dict[str, float]) -> float:
    """Add provisioning, setup and idle before the launch; return when the run's time starts."""
    spans = sorted((s for s in prep if s.start < launched and s.end > s.start), key=lambda s: s.start)
    if not spans:
        return launched
    start = spans[0].start
    covered = start
    for span in spans:
        if span.start > covered:
            seconds[IDLE] += span.start - covered
        begin, finish = max(span.start, covered), min(span.end, launched)
        if finish > begin:
            seconds[PREP_CATEGORY.get(span.kind, SETUP)] += finish - begin
            covered = finish
    seconds[IDLE] += max(0.0, launched - covered)
    return start


def _attempts(launched: float, restarts: list[float], end: float) -> list[tuple[float, float]]:
    starts = [launched, *restarts]
    return [(s, starts[i + 1] if i + 1 < len(starts) else end) for i, s in enumerate(starts)]


def _by_attempt(steps: Sequence[StepMark], attempts: list[tuple[float, float]]) -> list[list[StepMark]]:
    """Each attempt's steps in the order reported; a step reported before the launch (clocks apart) is the
    first attempt's, one after the end the last's."""
    marks: list[list[StepMark]] = [[] for _ in attempts]
    for mark in steps:
        index = next((i for i, (_, finish) in enumerate(attempts) if mark.t < finish), len(attempts) - 1)
        marks[index].append(mark)
    return marks


def _typical_step(marks: list[list[StepMark]], steps: Sequence[StepMark]) -> float | None:
    """The mean time between consecutive steps of an attempt, its first step left out (the library's
    average step time); with too few steps, the median of the times the program reported itself."""
    between = [b.t - a.t for attempt in marks for a, b in zip(attempt, attempt[1:], strict=False)
               if b.t >= a.t]
    if between:
        return sum(between) / len(between)
    reported = sorted(s.step_s for s in steps if s.step_s is not None and s.step_s >= 0)
    return reported[len(reported) // 2] if reported else None


def format_seconds(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


# -- goodput beside the other summary metrics (runs compare) ------------------------------------------

GOODPUT_PCT = "goodput_pct"
SUMMARY_KEYS = {GOODPUT_PCT: (LABELS[PRODUCTIVE], False),
                **{f"badput_{key}_pct": (LABELS[key], True) for key in BADPUT}}


def summary_fields(result: Goodput | None) -> dict[str, float | None]:
    """Goodput and each badput in percent of the run's time, under the keys `runs compare` rows use."""
    if result is None:
        return dict.fromkeys(SUMMARY_KEYS)
    return {GOODPUT_PCT: _round(result.percent()),
            **{f"badput_{key}_pct": _round(result.percent(key)) for key in BADPUT}}


def summary_metrics() -> list[tuple[str, str, bool]]:
    """(key, label, lower_is_better) of each goodput row of a comparison."""
    return [(key, f"{'goodput' if key == GOODPUT_PCT else 'badput'}: {label} (%)", lower)
            for key, (label, lower) in SUMMARY_KEYS.items()]


def steps_from_events(events: Iterable[Any]) -> list[StepMark]:
    """StepMarks from parsed events (runs.events.Event) of kind step with a time."""
    from tpu_console.history.events import STEP_S

    marks = []
    for event in events:
        if event.kind == "step" and event.t is not None and isinstance(event.get("step"), int | float):
            step_s = event.get(STEP_S)
            marks.append(StepMark(int(event.get("step")), float(event.t),
                                  float(step_s) if isinstance(step_s, int | float) else None))
    return marks


def restarts_from_decisions(decisions: Iterable[Any]) -> list[float]:
    """When the supervisor restarted the job (runs.supervision.Decision of kind restart)."""
    return [d.t for d in decisions if d.decision == "restart"]


def ended_from_decisions(decisions: Iterable[Any]) -> float | None:
    return next((d.t for d in reversed(list(decisions)) if d.decision == "ended"), None)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"

