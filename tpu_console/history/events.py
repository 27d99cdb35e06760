"""Reading the trainer's `events.jsonl`: flat JSON objects, one per line, into small typed records.

The file is being appended to while the console reads it, so the last line may be cut short: a line that
is not a complete JSON object is skipped, never an error. Metric keys are the W&B names of docs/contract.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainer import telemetry as tm  # the metric names live there, once (stdlib only, no JAX)

KINDS = tm.EVENT_KINDS

STEP_S = tm.phase_key("step")
STEP_AVG_LAST10_S = tm.STEP_AVG_LAST10
TOKENS_PER_S = tm.VALID_TOKENS_PER_S
MEM_IN_USE_GIB = tm.MEM_IN_USE
MEM_PEAK_GIB = tm.MEM_PEAK
MEM_LIMIT_GIB = tm.MEM_LIMIT
REWARD_MEAN = tm.REWARD_MEAN
LOSS = tm.LOSS
_PHASE_PREFIX, _PHASE_SUFFIX = "time/train/", "_s"
RECENT_STEPS = 64


@dataclass(frozen=True)
class Event:
    kind: str
    t: float | None
    process: int | None
    fields: dict[str, Any] = field(default_factory=dict)  # everything but kind, t and process

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)


@dataclass(frozen=True)
class StepMetrics:
    """The numbers a person looks at first; None where the trainer wrote null or nothing."""

    step: int
    step_s: float | None
    step_avg_last10_s: float | None
    tokens_per_s: float | None
    mem_in_use_gib: float | None
    mem_peak_gib: float | None
    mem_limit_gib: float | None
    loss: float | None
    reward_mean: float | None
    phases: dict[str, float]  # rollout_generate, reward, ... in seconds
    # the step line's format when the job runner read it from a command job's output (worker/step_lines.py)
    format: str | None = None

    @classmethod
    def from_event(cls, event: Event) -> StepMetrics:
        phases = {
            key[len(_PHASE_PREFIX) : -len(_PHASE_SUFFIX)]: value
            for key, value in event.fields.items()
            if key.startswith(_PHASE_PREFIX)
            and key.endswith(_PHASE_SUFFIX)
            and key not in (STEP_S, STEP_AVG_LAST10_S)
            and isinstance(value, int | float)
        }
        return cls(
            step=int(event.get("step", 0) or 0),
            step_s=_number(event.get(STEP_S)),
            step_avg_last10_s=_number(event.get(STEP_AVG_LAST10_S)),
            tokens_per_s=_number(event.get(TOKENS_PER_S)),
            mem_in_use_gib=_number(event.get(MEM_IN_USE_GIB)),
            mem_peak_gib=_number(event.get(MEM_PEAK_GIB)),
            mem_limit_gib=_number(event.get(MEM_LIMIT_GIB)),
            loss=_number(event.get(LOSS)),
            reward_mean=_number(event.get(REWARD_MEAN)),
            phases=phases,
            format=event.get("format") if isinstance(event.get("format"), str) else None,
        )


def parse_event_line(line: str) -> Event | None:
    """One line of events.jsonl, or None for a blank, cut-short or foreign line."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    kind = data.pop("kind")
    t = _number(data.pop("t", None))
    process = data.pop("process", None)
    return Event(kind=kind, t=t, process=process if isinstance(process, int) else None, fields=data)


def parse_events(text: str, starts_mid_line: bool = False) -> list[Event]:
    """Every complete event in `text`. `starts_mid_line`: `text` is the end of a longer file, so its
    first line may be the tail of a line and is dropped."""
    lines = text.split("\n")
    if starts_mid_line:
        lines = lines[1:]
    return [event for line in lines if (event := parse_event_line(line)) is not None]


@dataclass
class EventSummary:
    """What the events seen so far say about one worker's process."""

    start: Event | None = None
    last_step: StepMetrics | None = None
    last_eval: Event | None = None
    error: Event | None = None  # the last error event
    end: Event | None = None
    warnings: int = 0
    # the last RECENT_STEPS steps: step -> (its event's time, its step time), for observe/stragglers.py
    recent_steps: dict[int, tuple[float, float | None]] = field(default_factory=dict)

    @property
    def error_message(self) -> str | None:
        if self.error is None:
            return None
        message = self.error.get("message") or self.error.get("type") or "error"
        hint = self.error.get("hint")
        return f"{message} ({hint})" if hint else str(message)

    def add(self, events: Iterable[Event]) -> EventSummary:
        for event in events:
            if event.kind == "start":
                self.start = event
            elif event.kind == "step":
                self.last_step = StepMetrics.from_event(event)
                if event.t is not None:
                    self.recent_steps[self.last_step.step] = (event.t, self.last_step.step_s)
                    while len(self.recent_steps) > RECENT_STEPS:
                        del self.recent_steps[min(self.recent_steps)]
            elif event.kind == "eval":
                self.last_eval = event
            elif event.kind == "error":
                self.error = event
            elif event.kind == "end":
                self.end = event
            elif event.kind == "warning":
                self.warnings += 1
        return self


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
