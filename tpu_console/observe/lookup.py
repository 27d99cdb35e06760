"""Looking at launched runs: live status, history, logs (one-shot or followed), the supervisor's decisions.

Each call looks the run up in the history (`RunStore`), reaches its node's workers over one Fleet, and
feeds what the workers say into a `RunMonitor`. What was learnt goes back into the history, so `runs`
shows how a run ended even after its node is gone. A look at one run (`run_status`) is one command per
worker: its state, the ends of its events and log, and the supervisor's decisions come back together.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tpu_console.errors import UserError
from tpu_console.fleet import run_recipes
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.history.archive import archived_events_in
from tpu_console.history.run_id import check_run_id
from tpu_console.history.store import RunRecord, RunStore, WorkerRecord
from tpu_console.history.tail import TailCursor, parse_chunk
from tpu_console.observe.foreign_metrics import ForeignReadings, command_job, read_foreign
from tpu_console.observe.monitor import RunMonitor, RunState, WorkerState, WorkerStatus
from tpu_console.observe.probe import parse_probe
from tpu_console.observe.reach import NodeWorkers, reach_node
from tpu_console.observe.run_end import keep_run_end
from tpu_console.observe.supervision import DECISIONS_FILE, Decision, parse_decisions
from tpu_console.observe.watch import LogLines, RunWatch, Update
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node

STATUS_EVENTS_TAIL_BYTES = 64 * 1024
DECISIONS_TAIL_BYTES = 1 << 20  # as much of supervisor.jsonl as `read_run_file` reads


@dataclass
class RunView:
    """A run as last seen: live (just probed) or from the history alone."""

    record: RunRecord
    state: str
    workers: list[WorkerStatus]
    failure: str | None = None
    live: bool = False
    problem: str | None = None  # why it could not be probed now (node gone, unreachable ...)
    decisions: list[Decision] | None = None  # the supervisor's, when asked and read (None: not known)
    foreign: ForeignReadings | None = None  # a command job's W&B and TensorBoard readings, when asked


# -- status and history --------------------------------------------------------------------------------


async def run_status(providers: dict[str, Provider], run_id: str, store: RunStore | None = None,
                     foreign: bool = False) -> RunView:
    """One run, probed now: each worker's state, exit status, latest step metrics and error, and the
    supervisor's decisions, in one command per worker (the archived decisions once the node is out of
    reach); with `foreign`, a command job's W&B and TensorBoard readings over the same connections."""
    store = store or RunStore()
    record = store.get(check_run_id(run_id))
    (view,) = await observe(providers, [record], store, STATUS_EVENTS_TAIL_BYTES, log_tail_lines=3,
                            decisions=True, foreign=foreign)
    if view.decisions is None:
        view.decisions = archived_decisions(view.record)
    return view


async def list_runs(
    providers: dict[str, Provider], node: str | None = None, store: RunStore | None = None, limit: int = 50
) -> list[RunView]:
    """The history, most recent first; runs not known to have finished are probed now."""
    store = store or RunStore()
    records = store.list(node, limit)
    if node is not None and not records:
        await find_node(providers, node)  # a name that is neither a node nor in the history is an error
    unfinished = [r for r in records if not r.finished]
    live = {v.record.run_id: v for v in await observe(providers, unfinished, store)} if unfinished else {}
    return [live.get(r.run_id) or _from_history(r) for r in records]


async def show_run(
    providers: dict[str, Provider], record: RunRecord, store: RunStore | None = None
) -> RunView:
    """One run for `runs show`: from the history once it has ended, else probed now (with its events, the
    supervisor's decisions and a command job's W&B and TensorBoard readings, in one look)."""
    store = store or RunStore()
    if record.finished:
        view = _from_history(record)
        if record.archive_path and Path(record.archive_path).is_dir():
            # each worker's last step and error as its events had them when the run ended
            archived = await asyncio.to_thread(archived_events_in, Path(record.archive_path), record.workers)
            for status in view.workers:
                status.events = archived.get(status.worker, status.events)
        return view
    (view,) = await observe(providers, [record], store, STATUS_EVENTS_TAIL_BYTES, log_tail_lines=1,
                            decisions=True, foreign=True)
    view.record = store.get(record.run_id)  # with the summary and archive an end just recorded
    return view


async def observe(
    providers: dict[str, Provider],
    records: Sequence[RunRecord],
    store: RunStore,
    events_tail_bytes: int = 0,
    log_tail_lines: int = 0,
    decisions: bool = False,
    foreign: bool = False,
) -> list[RunView]:
    """Probe the given runs (one command per worker, grouped by node) and update the history; with
    `decisions`, the supervisor's in the same command, and with `foreign`, a command job's W&B and
    TensorBoard readings over the same connections."""
    by_node: dict[str, list[RunRecord]] = defaultdict(list)
    for record in records:
        by_node[record.node].append(record)
    views: dict[str, RunView] = {}

    async def one_node(name: str, node_records: list[RunRecord]) -> None:
        async with reach_node(providers, name) as reach:
            for record, view in zip(
                node_records,
                await probe_records(reach, node_records, events_tail_bytes, log_tail_lines, decisions),
                strict=True,
            ):
                if record.finished and reach.fleet is None:
                    # an ended run on a node out of reach (deleted): the probe taught nothing, and the
                    # history's word (the supervisor's, from its bucket record) stands
                    view = replace(_from_history(record), problem=view.problem)
                    views[record.run_id] = view
                    continue
                views[record.run_id] = view
                save_view(store, view)
                if reach.fleet is not None and all(s.done for s in view.workers):
                    # Ended: archive its files and keep its summary (once; a later look skips this).
                    await keep_run_end(reach.fleet, store.get(record.run_id), store)
                if foreign and reach.fleet is not None and command_job(record) is not None:
                    view.foreign = await read_foreign(reach.fleet, record)

    await asyncio.gather(*(one_node(name, recs) for name, recs in by_node.items()))
    return [views[r.run_id] for r in records]


async def probe_records(
    reach: NodeWorkers, records: list[RunRecord], events_tail_bytes: int, log_tail_lines: int,
    decisions: bool = False,
) -> list[RunView]:
    monitors = {r.run_id: _monitor(r) for r in records}
    if reach.fleet is None:
        for record in records:
            monitor = monitors[record.run_id]
            for worker in record.workers:
                if not monitor.workers[worker].done:
                    monitor.observe_unreachable(worker, reach.problem or "unreachable")
        return [
            _view(r, monitors[r.run_id], live=False, problem=reach.problem, lost=reach.node_gone)
            for r in records
        ]
    workers = sorted({w for r in records for w in r.workers if w in reach.fleet.targets})
    command = run_recipes.probe_runs([r.run_id for r in records], events_tail_bytes, log_tail_lines,
                                 decisions_bytes=DECISIONS_TAIL_BYTES if decisions else 0)
    results = await reach.fleet.run(command, workers, timeout=60)
    said: dict[str, list[Decision]] = {}  # the supervisor's decisions, from its worker (the run's first)
    for result in results:
        probes = parse_probe(result.stdout, events_tail_bytes) if result.ok else {}
        for record in records:
            if result.worker not in record.workers:
                continue
            monitor = monitors[record.run_id]
            if record.run_id in probes:
                monitor.observe(result.worker, probes[record.run_id])
                if decisions and result.worker == record.workers[0]:
                    said[record.run_id] = parse_decisions(probes[record.run_id].decisions or "")
            else:
                monitor.observe_unreachable(
                    result.worker, result.error or last_line(result.stderr, "probe failed")
                )
    return [replace(_view(r, monitors[r.run_id], live=True), decisions=said.get(r.run_id)) for r in records]


def _monitor(record: RunRecord, lost_after_unreachable: int = 1) -> RunMonitor:
    monitor = RunMonitor(record.run_id, record.workers, lost_after_unreachable)
    monitor.note_stop(record.stop_requested_at)
    for worker, saved in record.worker_records.items():
        if worker in monitor.workers and saved.state in (WorkerState.EXITED, WorkerState.LOST):
            # Final states are kept: a finished worker's folder may be gone since.
            status = monitor.workers[worker]
            status.state = WorkerState(saved.state)
            status.exit_status, status.pgid, status.reason = saved.exit_status, saved.pgid, saved.start_error
            status.exit_time = saved.exit_time  # orders the failures as when they were first seen
        elif worker in monitor.workers and saved.state == "failed":
            # It never started (launch undid the others): its failure came first, at launch time.
            status = monitor.workers[worker]
            status.state, status.reason = WorkerState.LOST, f"did not start: {saved.start_error}"
            # before any exit file's whole-second mtime
            status.exit_time = record.started_at.timestamp() - 1.0
    return monitor


def _view(
    record: RunRecord, monitor: RunMonitor, live: bool, problem: str | None = None, lost: bool = False
) -> RunView:
    if lost:  # the node is gone: nothing of this run can come back
        for status in monitor.workers.values():
            if not status.done:
                status.state, status.reason = WorkerState.LOST, problem
    state = monitor.state
    return RunView(
        record=record,
        state=str(state),
        workers=list(monitor.workers.values()),
        failure=monitor.failure_message(),  # a worker that failed before a stop
        live=live,
        problem=problem,
    )


def _from_history(record: RunRecord) -> RunView:
    monitor = _monitor(record)
    return RunView(record, record.state, list(monitor.workers.values()), record.failure, live=False)


def save_view(store: RunStore, view: RunView) -> None:
    finished = all(s.done for s in view.workers)
    store.update(
        view.record.run_id,
        view.state,
        [WorkerRecord(s.worker, str(s.state), s.pgid, None, s.exit_status, s.exit_time)
         for s in view.workers],
        failure=view.failure,
        finished=finished,
    )


# -- logs ----------------------------------------------------------------------------------------------


async def logs(
    providers: dict[str, Provider],
    run_id: str,
    on_line: Callable[[int, str], None],
    workers: str = "all",
    lines: int | None = 50,
    follow: bool = False,
    store: RunStore | None = None,
    poll_s: float = 0.25,
) -> RunView:
    """Print each selected worker's output.log through `on_line(worker, text)`: the last `lines` lines
    (all of it when None), and with `follow`, everything written after, until every worker's job has
    ended (through a `RunWatch`, see watch.py). Reads resume from byte offsets, so a dropped connection
    loses nothing."""
    store = store or RunStore()
    record = store.get(check_run_id(run_id))
    async with reach_node(providers, record.node) as reach:
        if reach.fleet is None:
            raise UserError(f"cannot read the logs of {run_id}: {reach.problem}")
        fleet = reach.fleet
        selected = _run_workers(record, workers, len(fleet.targets))
        if follow:
            watch = RunWatch(
                fleet, record, workers=selected, first_log_lines=lines, store=store, poll_s=poll_s
            )

            def on_update(update: Update) -> None:
                if isinstance(update, LogLines):
                    for text in update.lines:
                        on_line(update.worker, text)

            await watch.run(on_update)
            (view,) = await probe_records(reach, [record], STATUS_EVENTS_TAIL_BYTES, 3)
            save_view(store, view)
            return view
        # One look: each selected log read to its current end (the run's state: one probe at the end).
        cursors = {w: TailCursor() for w in selected}
        behind: set[int] = set(selected)  # workers whose log was not read to its end yet

        async def read(worker: int, first: bool) -> None:
            cursor = cursors[worker]
            if first and lines is not None:
                tail = run_recipes.tail_log(record.run_id, lines=lines)
            else:
                tail = run_recipes.tail_log(record.run_id, offset=cursor.offset, max_bytes=cursor.max_bytes)
            (result,) = await fleet.run(tail, [worker], timeout=60)
            chunk = parse_chunk(result.stdout) if result.ok else None
            if chunk is None:  # unreachable, or no log to read: the closing probe says which
                behind.discard(worker)
                return
            caught_up = chunk.end >= chunk.size
            for text in cursor.take(chunk, final=caught_up):
                on_line(worker, text)
            if caught_up:
                behind.discard(worker)

        await asyncio.gather(*(read(w, first=True) for w in selected))
        while pending := sorted(behind):
            await asyncio.gather(*(read(w, first=False) for w in pending))
        # One probe of the whole run with its events, for the closing state line and the history.
        (view,) = await probe_records(reach, [record], STATUS_EVENTS_TAIL_BYTES, 3)
        save_view(store, view)
    return view


def _run_workers(record: RunRecord, selection: str, worker_count: int) -> list[int]:
    """The workers asked for; `all` is every worker the run ran on (a run on a subset of the node)."""
    if selection.strip().lower() == "all" and record.workers:
        return sorted(w for w in record.workers if w < worker_count)
    chosen = parse_worker_selection(selection, worker_count)
    outside = [w for w in chosen if w not in record.workers]
    if outside:
        launched = ",".join(str(w) for w in record.workers)
        raise UserError(f"worker {outside[0]} did not run {record.run_id} (it ran on workers {launched})")
    return chosen


# -- reaching a run's node -----------------------------------------------------------------------------


def last_line(stderr: str, default: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else default


__all__ = ["RunState", "RunView", "list_runs", "logs", "observe", "run_status"]


async def supervisor_decisions(providers: dict[str, Provider], record: RunRecord) -> list[Decision] | None:
    """What the run's supervisor decided (supervisor.jsonl on its worker; the archived copy once the run
    ended and was archived), or None when it cannot be read (node gone or unreachable). `run_status` reads
    them in its own look: this is for a caller without one."""
    if (archived := archived_decisions(record)) is not None:
        return archived
    async with reach_node(providers, record.node) as reached:
        if reached.fleet is None or not record.workers:
            return None
        (result,) = await reached.fleet.run(
            run_recipes.read_run_file(record.run_id, DECISIONS_FILE), [record.workers[0]], timeout=30
        )
    return parse_decisions(result.stdout) if result.ok else None


def archived_decisions(record: RunRecord) -> list[Decision] | None:
    """The supervisor's decisions as archived when the run ended (None: not archived here)."""
    if record.archive_path and record.workers:
        archived = Path(record.archive_path) / f"worker-{record.workers[0]}" / DECISIONS_FILE
        if archived.is_file():
            return parse_decisions(archived.read_text(errors="replace"))
    return None
