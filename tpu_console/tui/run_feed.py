"""The run dashboard's one source of data: a `RunWatch` on the run (observe/watch.py), turned into messages.

Everything the dashboard shows comes through here, so the widgets stay pure (tests feed them fixed
messages) and a change in the runs layer is a change in this file only. The screen runs each loop as an
exclusive Textual worker:

    follow(post)          the watch's updates until the run has ended: log lines and every step event from
                          step 1 (the watch reads events.jsonl from offset 0, so the plots have the whole
                          history), posted as they arrive, at most every `flush_every_s` (one message for
                          what arrived meanwhile), log signatures
                          (OOM with its hint, TPU in use, tracebacks ...), the W&B URL, and a `RunSnapshot`
                          whenever the watcher's health changes (and every `snapshot_every_s`, so stall
                          ages move)
    follow_devices(post)  libtpu's live HBM and duty cycle of every device (observe/device_metrics.py), every
                          `devices_every_s`; the screen runs it while the HBM tab is shown
    (within follow)       a command job's TensorBoard scalars as its steps, every `tensorboard_every_s`, for
                          workers whose output has no step lines (observe/foreign_metrics.py)
    stop_run()            stop the run's job on every worker (stop.py), e.g. workers hung after a failure

The judgements (a worker stalled, hung after another failed, a straggler; the verdict) are the watcher's
(observe/health.py), carried into the snapshot as they were made. Lines and events arrive masked by the
watch (the values of the .env files uploaded to the node), before any widget sees them.

When the node cannot be reached (deleted, not READY) the dashboard shows what the run history knows and,
unless the run is over, tries again with backoff. A watch that fails half-way is reopened where it
stopped (its byte offsets carried over), so no line is shown twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import operator
import time
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from textual.message import Message

from tpu_console.domain import worker_slices
from tpu_console.errors import NotFound, Unreachable, UserError, one_line
from tpu_console.history.events import EventSummary, StepMetrics
from tpu_console.history.goodput import Goodput
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.launch.stop import stop
from tpu_console.observe import lookup
from tpu_console.observe.device_metrics import LIBTPU_METRICS_ADDRESS, read_device_metrics
from tpu_console.observe.foreign_metrics import (
    command_job,
    fetch_tensorboard,
    steps_note,
    tensorboard_dir,
    tensorboard_steps,
)
from tpu_console.observe.goodput_report import GoodputTracker, preparation
from tpu_console.observe.health import Activity, RunHealth, WorkerHealth, assess
from tpu_console.observe.monitor import RunMonitor, RunState
from tpu_console.observe.signatures import EXCEPTION, WANDB_URL, Finding
from tpu_console.observe.watch import (
    HealthChanged,
    LogLines,
    NewEvents,
    RunWatch,
    SignatureFound,
    SupervisorDecided,
    Update,
    WatchEnded,
)
from tpu_console.providers.base import Provider
from tpu_console.providers.nodes import list_nodes
from tpu_console.providers.registry import find_node
from tpu_console.secrets import SecretMasker
from tpu_console.tui.messages import (
    RunDevicesRead,
    RunFeedProblem,
    RunLogLines,
    RunSignatureFound,
    RunStepsArrived,
    RunSupervisorDecided,
    RunUpdated,
)
from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow
from tpu_console.views.nodes import run_node_warning

Post = Callable[[Message], object]
# Opens a watch on the run; the argument is RunWatch's `first_log_lines` (None: from where it left off).
OpenWatch = Callable[[int | None], AbstractAsyncContextManager[RunWatch]]

RETRY_FIRST_S, RETRY_MAX_S = 2.0, 30.0
NODE_CHECK_S = 300.0  # how often the node's announced maintenance is looked at again
BACKLOG_WAIT_S = 1.0  # how long the workers' first lines wait for each other's, to interleave by time
TENSORBOARD_EVERY_S = 15.0  # how often a command job's TensorBoard files are copied again (when they grew)
# Run states that are final: every worker's job is over (runs.monitor.RunState).
# The supervisor's bookkeeping, not worth a toast.
QUIET_DECISIONS = ("notified", "notify-failed")
_VERDICTS = (str(RunState.SUCCEEDED), str(RunState.FAILED), str(RunState.STOPPED))


def local_now() -> datetime:
    return datetime.now().astimezone()


@dataclass
class WorkerSeen:
    """What one worker's files said last; the snapshot adds the watcher's health of the worker to it."""

    events: EventSummary = field(default_factory=EventSummary)  # its last step and error event
    last_line: str = ""
    problem: Finding | None = None  # the most telling log signature so far
    traceback: str | None = None  # its log's last Python traceback, whole

    def saw(self, finding: Finding) -> None:
        # A specific signature (OOM, TPU in use ...) beats a bare traceback and stays; of tracebacks, the
        # last one counts (as runs.signatures.SignatureScanner.first_problem decides).
        if self.problem is None or self.problem.kind == EXCEPTION:
            self.problem = finding
        if finding.traceback is not None:
            self.traceback = finding.traceback


class RunFeed:
    def __init__(
        self,
        providers: dict[str, Provider],
        run_id: str,
        store: RunStore | None = None,
        *,
        clock: Callable[[], datetime] = local_now,
        first_log_lines: int | None = 200,
        poll_s: float = 0.25,
        flush_every_s: float = 0.05,
        snapshot_every_s: float = 1.0,
        devices_every_s: float = 5.0,
        metrics_address: str = LIBTPU_METRICS_ADDRESS,
        open_watch: OpenWatch | None = None,
    ) -> None:
        """`first_log_lines`: each worker's log starts at its last N lines (None: from its beginning; events
        are always read whole).
        `poll_s`: how often a caught-up worker's follower looks at its files again (a line shows within
        about that).
        `open_watch`: how the watch is opened (default: `RunWatch.open` on the run's node; the benchmark
        passes one over a synthetic fleet)."""
        self.providers = providers
        self.run_id = run_id
        self.store = store
        self.clock = clock
        self.first_log_lines = first_log_lines
        self.poll_s = poll_s
        self.flush_every_s = flush_every_s
        self.snapshot_every_s = snapshot_every_s
        self.devices_every_s = devices_every_s
        self.metrics_address = metrics_address
        self.open_watch: OpenWatch = open_watch or self._open_run_watch
        self.watch: RunWatch | None = None
        self.record: RunRecord | None = None
        self.health: RunHealth | None = None
        self.seen: dict[int, WorkerSeen] = {}
        self.wandb_url: str | None = None
        self.ended = False  # the watch has read every worker's files to the end after its job ended
        # (worker, lines, when they were written: one time for them all (when they arrived here), or each
        # line's mark on the worker, else its arrival)
        self._pending_lines: list[tuple[int, list[str], float | tuple[float, ...]]] = []
        self._arrived = asyncio.Event()  # lines or steps wait to be posted
        self._pending_steps: dict[int, list[StepMetrics]] = {}  # by worker, since the last flush
        # The first lines of each worker (its last lines so far) come at once, a worker after another:
        # held until every worker's have come (or BACKLOG_WAIT_S passed), so they interleave by time.
        self._backlog_from: set[int] = set()
        self._backlog_until = 0.0
        self._watching = asyncio.Event()  # a watch is open (device metrics ride on its connections)
        self._probe_python: str | None = None
        self._last_turning_point: tuple | None = None
        self.node_warning: str | None = None  # check_node's
        self.goodput_tracker: GoodputTracker | None = None
        self.tensorboard_every_s = TENSORBOARD_EVERY_S
        self._tensorboard_shown: dict[int, int] = {}  # worker: the last step its TensorBoard files gave

    def _open_run_watch(self, first_log_lines: int | None) -> AbstractAsyncContextManager[RunWatch]:
        return RunWatch.open(self.providers, self.run_id, self.store, first_log_lines=first_log_lines,
                             poll_s=self.poll_s)

    # -- the watch -------------------------------------------------------------------------------------

    async def follow(self, post: Post) -> None:
        """Watch the run until every worker's job is over and its files are read to the end."""
        delay = RETRY_FIRST_S
        failed: RunWatch | None = None  # a watch that failed half-way: the next one resumes from it
        while True:
            try:
                async with self.open_watch(None if failed else self.first_log_lines) as watch:
                    if failed is not None:
                        carry_over(failed, watch)
                    self.watch, self.record = watch, watch.record
                    if failed is None:
                        self._backlog_from = set(watch.streamed)
                        self._backlog_until = time.monotonic() + BACKLOG_WAIT_S
                    self._watching.set()
                    post(RunFeedProblem(None))
                    await self._consume(watch, post)
                    return
            except NotFound as exc:  # no such run
                post(RunFeedProblem(one_line(exc)))
                return
            except UserError as exc:  # its node cannot be reached: deleted, not READY, no SSH access
                post(RunFeedProblem(one_line(exc)))
                if await self._show_history(post):
                    return
            except Exception as exc:  # noqa: BLE001 - shown on screen; the next watch resumes
                post(RunFeedProblem(f"watching {self.run_id} failed: {one_line(exc)}"))
                if self.watch is not None and self.watch.ended:
                    # every job is over and read: what failed came after (keeping its archive, a full
                    # disk); the run's end is shown all the same, with that problem beside it
                    self.take(WatchEnded(self.watch.health()), post)
                    return
                failed = self.watch or failed
            finally:
                self._watching.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _consume(self, watch: RunWatch, post: Post) -> None:
        ticker = asyncio.create_task(self._tick(watch, post))
        node_check = asyncio.create_task(self.check_node())
        tensorboard = asyncio.create_task(self._follow_tensorboard(watch, post))
        try:
            async for update in watch.updates():
                self.take(update, post)
        finally:
            node_check.cancel()
            ticker.cancel()
            tensorboard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            with contextlib.suppress(asyncio.CancelledError):
                await tensorboard
            self.flush(post, force=True)
        await self._read_tensorboard(watch, post)  # what was written last, before the job ended

    async def _follow_tensorboard(self, watch: RunWatch, post: Post) -> None:
        while True:
            await self._read_tensorboard(watch, post)
            await asyncio.sleep(self.tensorboard_every_s)

    async def _read_tensorboard(self, watch: RunWatch, post: Post) -> None:
        """New steps of a command job's TensorBoard files (tunix writes its metrics only there), for the
        workers whose output has given no step line."""
        job = command_job(watch.record)
        folder = tensorboard_dir(job) if job is not None else None
        for worker in watch.record.workers if folder is not None else ():
            seen = self.seen.get(worker)
            if seen is not None and seen.events.last_step is not None:
                continue  # its own step lines, read on the worker
            try:
                local = await fetch_tensorboard(watch.fleet, watch.record.run_id, folder, worker)
                steps = await asyncio.to_thread(tensorboard_steps, local) if local is not None else []
            except (Unreachable, OSError, ValueError):
                continue  # tried again at the next round; status and runs show name the problem
            new = [s for s in steps if s.step > self._tensorboard_shown.get(worker, -1)]
            if new:
                self._tensorboard_shown[worker] = new[-1].step
                post(RunStepsArrived({worker: new}))

    def take(self, update: Update, post: Post) -> None:
        """One update of the watch: what it adds to the dashboard."""
        match update:
            case LogLines(worker, lines, times):
                arrived = time.time()
                if times.count(None) < len(times):  # some have their mark: each line its own time
                    self._pending_lines.append((worker, lines, tuple(arrived if at is None else at
                                                                     for at in times)))
                else:
                    self._pending_lines.append((worker, lines, arrived))
                self._seen(worker).last_line = lines[-1]
                self._backlog_from.discard(worker)
                self._arrived.set()
            case NewEvents(worker, events):
                self._seen(worker).events.add(events)
                if (tracker := self._goodput_tracker()) is not None:
                    tracker.add_events(worker, events)
                steps = [StepMetrics.from_event(e) for e in events if e.kind == "step"]
                if steps:  # posted with the next lines: one message for every worker's
                    self._pending_steps.setdefault(worker, []).extend(steps)
                    self._arrived.set()
            case SupervisorDecided(decisions):
                if (tracker := self._goodput_tracker()) is not None:
                    tracker.add_decisions(decisions)
                shown = [d.message for d in decisions if d.decision not in QUIET_DECISIONS]
                if shown:
                    post(RunSupervisorDecided(shown))
            case SignatureFound(worker, finding) if finding.kind == WANDB_URL:
                self.wandb_url = self.wandb_url or finding.detail
            case SignatureFound(worker, finding):
                self._seen(worker).saw(finding)
                post(RunSignatureFound(worker, finding.kind, finding.message))
            case HealthChanged(health) | WatchEnded(health):
                self.health = health
                self.ended = self.ended or isinstance(update, WatchEnded)
                # A new step number changes the health too (several times a second on a big pod): that
                # waits for the next tick; a change of state, exit, hang or verdict is shown at once.
                if self.ended or _turning_point(health) != self._last_turning_point:
                    self._last_turning_point = _turning_point(health)
                    self.flush(post, force=self.ended)  # the lines first, then the state they led to
                    post(RunUpdated(self.snapshot()))

    async def _tick(self, watch: RunWatch, post: Post) -> None:
        """Post what arrived as soon as it arrives, at most once every `flush_every_s` (a line after a quiet
        spell shows at once; a stream is batched); judge the run again every `snapshot_every_s` (the health
        changes only when a label does; a stalled worker's age and the straggler times move in between)."""
        judged = flushed = time.monotonic()
        while True:
            until_judgement = judged + self.snapshot_every_s - time.monotonic()
            if not self._arrived.is_set() and until_judgement > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), until_judgement)
            if (pause := flushed + self.flush_every_s - time.monotonic()) > 0:
                await asyncio.sleep(pause)
            self._arrived.clear()
            self.flush(post)
            flushed = time.monotonic()
            if self._pending_lines:  # held back while the workers' first lines wait for each other's
                self._arrived.set()
            if time.monotonic() - judged >= self.snapshot_every_s and not self.ended:
                judged = time.monotonic()
                self.health = watch.latest_health or watch.health()  # judged by the watch a moment ago
                post(RunUpdated(self.snapshot()))

    def flush(self, post: Post, force: bool = False) -> None:
        """Post the steps and the lines gathered so far, the lines in the order they were written (while the
        workers' first lines still wait for each other's, only with `force`)."""
        if self._pending_steps:
            steps, self._pending_steps = self._pending_steps, {}
            post(RunStepsArrived(steps))
        if self._backlog_from and time.monotonic() < self._backlog_until and not force:
            return
        if self._pending_lines:
            lines, self._pending_lines = self._pending_lines, []
            self._backlog_from.clear()
            post(RunLogLines(in_time_order(lines)))

    def _seen(self, worker: int) -> WorkerSeen:
        seen = self.seen.get(worker)
        if seen is None:
            seen = self.seen[worker] = WorkerSeen()
        return seen

    async def check_node(self, every_s: float = NODE_CHECK_S) -> None:
        """The node's health, symptoms and announced maintenance, looked at now and then: a warning when
        it is unhealthy, has symptoms, or its maintenance falls in the run."""
        while self.record is not None:
            try:  # the listing, not a lookup: only the listing reads maintenance (gcp's v2alpha1)
                listing = await list_nodes(self.providers)
            except Exception:  # noqa: BLE001 - a nicety: the watch itself reports a node that is gone
                listing = None
            node = next((n for n in listing.nodes if n.name == self.record.node), None) if listing else None
            if node is not None:
                self.node_warning = run_node_warning(node, self.record.started_at, self.record.finished_at)
            if every_s <= 0:
                return
            await asyncio.sleep(every_s)

    # -- what the dashboard shows ----------------------------------------------------------------------

    def snapshot(self) -> RunSnapshot:
        """The run now: the watcher's health of every worker, with what its files said last."""
        assert self.health is not None and self.record is not None, "snapshot() before the first health"
        health = self.health
        slice_of = worker_slices(getattr(self.record, "slices", 1), self.record.workers)  # {}: one slice
        return RunSnapshot(
            run_id=self.record.run_id,
            node=self.record.node,
            state=health.state,
            workers=tuple(self._row(h, slice_of.get(w)) for w, h in sorted(health.workers.items())),
            updated_at=self.clock(),
            failure=health.failure,
            first_failure=health.first_failure,
            ended=health.state in _VERDICTS,
            wandb_url=self.wandb_url,
            hung=health.hung,
            stalled=health.stalled,
            all_silent=health.all_silent,
            stragglers=health.stragglers,
            node_warning=self.node_warning,
            steps_note=self._steps_note(),
            goodput=self._goodput(ended=health.state in _VERDICTS),
        )

    def _goodput_tracker(self) -> GoodputTracker | None:
        """The run's goodput as its events arrive (observe/goodput_report.py), once the run is known."""
        if self.goodput_tracker is None and self.record is not None:
            try:
                prep = preparation(self.record, self.store or RunStore())
            except Exception:  # noqa: BLE001 - a view; the run is watched all the same
                prep = []
            self.goodput_tracker = GoodputTracker(self.record, prep)
        return self.goodput_tracker

    def _goodput(self, ended: bool) -> Goodput | None:
        """None until a watch reads the run's events (the history alone has no steps to split)."""
        tracker = self._goodput_tracker()
        if tracker is None or self.watch is None:
            return None
        return tracker.goodput(now=time.time(), ended=ended)

    def _steps_note(self) -> str | None:
        if self._tensorboard_shown and self.record is not None:
            job = command_job(self.record) or {}
            return f"steps: from TensorBoard event files in {tensorboard_dir(job)}"
        last_steps = {w: s.events.last_step for w, s in self.seen.items()}
        return steps_note(self.record, last_steps, ended=self.ended)

    def _row(self, health: WorkerHealth, slice_index: int | None = None) -> WorkerRow:
        seen = self.seen.get(health.worker) or WorkerSeen()
        last = seen.events.last_step
        return WorkerRow(
            worker=health.worker,
            slice=slice_index,
            activity=str(health.activity),
            for_s=health.for_s,
            step=health.step,
            step_s=last.step_s if last else None,
            exit_status=health.exit_status,
            last_line=seen.last_line,
            failed=health.activity is Activity.LOST
            or (health.activity is Activity.EXITED and health.exit_status != 0),
            stopped=health.activity is Activity.STOPPED,
            step_age_s=health.step_age_s,
            hung=health.hung,
            straggler=health.straggler,
            reason=health.reason,
            error=seen.events.error_message,
            problem=seen.problem.message if seen.problem else None,
            problem_kind=seen.problem.kind if seen.problem else None,
            traceback=seen.traceback,
            mem_in_use_gib=last.mem_in_use_gib if last else None,
            mem_peak_gib=last.mem_peak_gib if last else None,
            mem_limit_gib=last.mem_limit_gib if last else None,
        )

    async def _show_history(self, post: Post) -> bool:
        """The run as a one-shot look (or the history alone) says it, when no watch can be opened. True
        when the run is over: nothing more can come."""
        try:
            view = await lookup.run_status(self.providers, self.run_id, self.store)
        except Exception:  # noqa: BLE001 - the problem that brought us here is on screen already
            return False
        masker = await asyncio.to_thread(SecretMasker.for_node, view.record.node)
        monitor = RunMonitor(view.record.run_id, view.record.workers)
        monitor.workers = {s.worker: s for s in view.workers}
        monitor.note_stop(view.record.stop_requested_at)
        self.record = view.record
        for status in view.workers:
            if status.done:  # lost with its node, or exited: for good, not a passing "unreachable"
                status.unreachable_probes = 0
            seen = self._seen(status.worker)
            seen.events = status.events
            if status.log_tail:
                seen.last_line = masker.mask(status.log_tail[-1])
            if status.events.last_step is not None:
                post(RunStepsArrived({status.worker: [status.events.last_step]}))
        health = assess(monitor, {}, time.monotonic())
        self.health = replace(health, failure=masker.mask(health.failure) if health.failure else None)
        post(RunUpdated(self.snapshot()))
        self.ended = all(s.done for s in view.workers)
        return self.ended

    # -- device metrics --------------------------------------------------------------------------------

    async def follow_devices(self, post: Post) -> None:
        """libtpu's metrics of every device of every worker, every `devices_every_s`, over the watch's
        connections, until the run has ended (no job holds the TPU then: nothing to read)."""
        while not self.ended:
            if not self._watching.is_set():  # not open yet, or being reopened
                await asyncio.sleep(0.5)
                continue
            watch = self.watch
            assert watch is not None
            try:
                python = await self._metrics_python(watch)
                answers = await read_device_metrics(watch.fleet, list(watch.record.workers), python,
                                                    self.metrics_address)
            except Exception as exc:  # noqa: BLE001 - shown in the panel; tried again
                post(RunDevicesRead([], f"cannot read libtpu's metrics: {one_line(exc)}"))
            else:
                post(RunDevicesRead(answers))
            await asyncio.sleep(self.devices_every_s)
        post(RunDevicesRead([], "the run has ended: libtpu reports only while a job holds the TPU"))

    async def _metrics_python(self, watch: RunWatch) -> str:
        """The interpreter that runs the probe, as `tpu-console metrics` picks it: the bootstrapped
        environment (it has tpu-info and grpcio) on every worker, else the provider's default."""
        if self._probe_python is None:
            from tpu_console.provision.worker_inspection import inspect_workers, worker_python

            provider, _ = await find_node(self.providers, watch.record.node)
            reports = await inspect_workers(watch.fleet, list(watch.record.workers))
            self._probe_python = worker_python(provider, reports)
        return self._probe_python

    # -- steering --------------------------------------------------------------------------------------

    async def stop_run(self) -> str:
        """TERM (then KILL) the run's job on every worker; one line saying how each ended."""
        if self.watch is not None:
            # so the verdict reads `stopped` once every job is over, and no worker it ends reads failed
            self.watch.monitor.note_stop(datetime.now(UTC))
        view, stops = await stop(self.providers, self.run_id, store=self.store)
        outcomes = Counter(s.outcome for s in stops)
        counts = ", ".join(f"{n} {what}" for what, n in sorted(outcomes.items()))
        return f"{self.run_id}: {view.state} ({counts})"

    async def stacks(self) -> str:
        """Where the run is stuck: every worker's Python stacks, grouped (observe/stacks.py), as text."""
        from tpu_console.observe.stacks import collect_stacks

        record = (self.store or RunStore()).get(self.run_id)
        found = await collect_stacks(self.providers, record)
        masker = SecretMasker.for_node(record.node)
        chips = found.device_line()
        blocks = [found.summary()] + ([chips] if chips else []) + [
            f"--- {found.who(g) if found.slice_of else ','.join(map(str, g.workers))}: {g.where}\n{g.stack}"
            for g in found.groups
        ]
        return masker.mask("\n\n".join(blocks))

    async def close(self) -> None:
        """Stop watching (the workers' jobs keep running)."""
        if self.watch is not None:
            self.watch.stop()


def _turning_point(health: RunHealth) -> tuple:
    """What of the health deserves a redraw at once: each worker's activity, exit status and hang, and the
    run's state and failure (not the step numbers, which the periodic snapshot brings)."""
    workers = tuple((h.activity, h.exit_status, h.hung) for _, h in sorted(health.workers.items()))
    return health.state, health.failure, workers


def in_time_order(chunks: list[tuple[int, list[str], float | tuple[float, ...]]]) -> list[tuple[int, str]]:
    """(worker, lines, when written: one time for them all, or each line's) as (worker, line), the workers'
    lines merged by when each was written (ties by worker); a worker's own lines keep their order whatever
    the times say. A worker's lines written at the same time move as one run, and while every worker's
    runs come in time order (the usual case) one stable sort merges them; else a merge per worker."""
    runs: list[tuple[float, int, list[str]]] = []
    last: dict[int, float] = {}  # each worker's latest run's time
    in_order = True
    for worker, lines, written in chunks:
        if not isinstance(written, tuple):
            pieces = [(written, worker, lines)]
        else:
            pieces, start = [], 0
            for end in range(1, len(lines) + 1):
                if end == len(lines) or written[end] != written[start]:
                    pieces.append((written[start], worker, lines[start:end]))
                    start = end
        for piece in pieces:
            in_order = in_order and piece[0] >= last.get(worker, piece[0])
            last[worker] = piece[0]
            runs.append(piece)
    by_time = operator.itemgetter(0, 1)
    if in_order:  # stable: a worker's runs with the same time keep their order
        ordered: Iterable[tuple[float, int, list[str]]] = sorted(runs, key=by_time)
    else:
        by_worker: dict[int, list[tuple[float, int, list[str]]]] = {}
        for run in runs:
            by_worker.setdefault(run[1], []).append(run)
        ordered = heapq.merge(*by_worker.values(), key=by_time)
    merged: list[tuple[int, str]] = []
    for _, worker, lines in ordered:
        merged.extend(zip(itertools.repeat(worker), lines))
    return merged


def carry_over(failed: RunWatch, watch: RunWatch) -> None:
    """Let `watch` go on where `failed` stopped: the same byte offsets, states and step timings, so no
    line is shown twice and none is skipped."""
    watch.workers, watch.monitor, watch.progress = failed.workers, failed.monitor, failed.progress
