"""A run's goodput from what was recorded of it (history/goodput.py computes it): the node's preparation
(history/prep_log.py), the launch and end in the history, a worker's step events, the supervisor's restarts.

The steps are one worker's: the run's first worker that reported any (in an SPMD job every worker makes
the same steps together; a program that logs on its first process only is read there). They come from
the run's archive once it ended, else from the worker itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tpu_console.fleet import run_recipes
from tpu_console.history.events import Event, parse_events
from tpu_console.history.goodput import (
    Goodput,
    Span,
    StepMark,
    Timeline,
    ended_from_decisions,
    goodput,
    restarts_from_decisions,
    steps_from_events,
)
from tpu_console.history.prep_log import PrepLog
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.observe import lookup
from tpu_console.observe.reach import reach_node
from tpu_console.observe.supervision import DECISIONS_FILE, Decision, parse_decisions
from tpu_console.providers.base import Provider

EVENTS = "events.jsonl"
MAX_EVENTS_BYTES = 64 << 20  # a live run's events read whole up to this (the end of the file past it)


def preparation(record: RunRecord, store: RunStore, log: PrepLog | None = None) -> list[Span]:
    """What was done on the run's node after the previous run on it ended, before this one started."""
    earlier = [r for r in store.list(record.node, limit=1000) if r.started_at < record.started_at]
    since = None
    if earlier:
        previous = max(earlier, key=lambda r: r.started_at)
        since = (previous.finished_at or previous.started_at).timestamp()
    return (log or PrepLog(store.path)).spans(record.node, since, record.started_at.timestamp())


class GoodputTracker:
    """A run's goodput as its events and the supervisor's decisions arrive (the dashboard's feed), or
    from all of them at once (build_timeline). Keeps only each step's number and time."""

    def __init__(self, record: RunRecord, prep: Sequence[Span]) -> None:
        self.record, self.prep = record, list(prep)
        self.steps: dict[int, list[StepMark]] = {}
        self.ends: list[float] = []
        self.decisions: list[Decision] = []

    def add_events(self, worker: int, events: Iterable[Event]) -> None:
        events = list(events)
        self.steps.setdefault(worker, []).extend(steps_from_events(events))
        self.ends.extend(e.t for e in events if e.kind == "end" and e.t is not None)

    def add_decisions(self, decisions: Iterable[Decision]) -> None:
        self.decisions.extend(decisions)

    def timeline(self, now: float | None = None, ended: bool | None = None) -> Timeline:
        """`ended`: the run is over (default: as the history says)."""
        steps = next((marks for _, marks in sorted(self.steps.items()) if marks), [])
        ended_at = None
        if self.record.finished if ended is None else ended:
            ended_at = ended_from_decisions(self.decisions) or (max(self.ends) if self.ends else None)
            if ended_at is None and self.record.finished_at is not None:
                ended_at = self.record.finished_at.timestamp()
            if ended_at is None:
                ended_at = max([s.t for s in steps] or [self.record.started_at.timestamp()])
        return Timeline(
            launched_at=self.record.started_at.timestamp(), steps=steps,
            restarts=restarts_from_decisions(self.decisions), prep=self.prep, ended_at=ended_at,
            now=time.time() if now is None else now,
        )

    def goodput(self, now: float | None = None, ended: bool | None = None) -> Goodput:
        return goodput(self.timeline(now, ended))


def build_timeline(
    record: RunRecord,
    events: Mapping[int, Sequence[Event]],
    decisions: Sequence[Decision] | None,
    prep: Sequence[Span],
    now: float | None = None,
) -> Timeline:
    """The run's timeline from its workers' events (worker -> events) and the supervisor's decisions."""
    tracker = GoodputTracker(record, prep)
    for worker, worker_events in events.items():
        tracker.add_events(worker, worker_events)
    tracker.add_decisions(decisions or ())
    return tracker.timeline(now)


def archived_events(record: RunRecord) -> dict[int, list[Event]] | None:
    """Every worker's events from the run's archive, or None when it has none."""
    if not record.archive_path or not Path(record.archive_path).is_dir():
        return None
    events = {}
    for worker in record.workers:
        path = Path(record.archive_path) / f"worker-{worker}" / EVENTS
        if path.is_file():
            events[worker] = parse_events(path.read_text(errors="replace"))
    return events


def archived_decisions(record: RunRecord) -> list[Decision] | None:
    if not record.archive_path or not record.workers:
        return None
    path = Path(record.archive_path) / f"worker-{record.workers[0]}" / DECISIONS_FILE
    return parse_decisions(path.read_text(errors="replace")) if path.is_file() else None


def archived_goodput(record: RunRecord, store: RunStore) -> Goodput | None:
    """An ended run's goodput from its archive alone (no network); None for a run not archived."""
    events = archived_events(record) if record.finished else None
    if events is None:
        return None
    return goodput(build_timeline(record, events, archived_decisions(record), preparation(record, store)))


async def live_events(providers: dict[str, Provider], record: RunRecord) -> dict[int, list[Event]] | None:
    """The run's first worker's events, read on the worker (None when it cannot be reached)."""
    if not record.workers:
        return None
    async with reach_node(providers, record.node) as reached:
        if reached.fleet is None:
            return None
        worker = record.workers[0]
        (result,) = await reached.fleet.run(
            run_recipes.read_run_file(record.run_id, EVENTS, MAX_EVENTS_BYTES), [worker], timeout=120
        )
    if not result.ok:
        return None
    return {worker: parse_events(result.stdout, starts_mid_line=len(result.stdout) >= MAX_EVENTS_BYTES)}


async def run_goodput(
    providers: dict[str, Provider], record: RunRecord, store: RunStore | None = None,
    decisions: Iterable[Decision] | None = None,
) -> Goodput | None:
    """The run's goodput now; None when its steps cannot be read (no archive and the node is gone)."""
    store = store or RunStore()
    events = archived_events(record) if record.finished else None
    if events is None:
        events = await live_events(providers, record)
    if events is None:
        return None
    if decisions is None:
        decisions = await lookup.supervisor_decisions(providers, record)
    return goodput(build_timeline(record, events, list(decisions or ()), preparation(record, store)))
