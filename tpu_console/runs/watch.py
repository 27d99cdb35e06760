"""Live watching of one run: every worker's `output.log` and `events.jsonl`, lossless, with the run's health.

The streaming API the CLI (`logs -f`) and the TUI's run dashboard build on:

    async with RunWatch.open(providers, run_id) as watch:      # or RunWatch(fleet, record) on a Fleet you hold
        async for update in watch.updates():                     # runs the watch until the run has ended
            match update:
                case LogLines(worker, lines): ...                 # complete, masked lines, in file order
                case NewEvents(worker, events): ...               # parsed events.jsonl lines (runs.events.Event)
                case SignatureFound(worker, finding): ...         # runs.signatures.Finding: OOM, TPU in use ...
                case HealthChanged(health): ...                   # runs.health.RunHealth: activities, verdict,
                                                                  # hung / stalled / straggler workers
                case WatchEnded(health): ...                      # the last update
    # or, without the iterator: `await watch.run(on_update=callback)`

Between updates the watch keeps, per worker (`watch.workers[i]`, a `WorkerStream`): a bounded ring buffer
of the latest log lines and events (memory stays bounded whatever the log size), the signature scanner
(first problem, W&B URL), and the byte offsets read up to. `watch.monitor` is the `RunMonitor`;
`watch.health()` judges it now.

How it reads: one command per worker per poll (fleet/recipes.py `watch_poll`) probes the job and returns
both files' new bytes from the offsets read so far, over the worker's persistent connection (the command
channel once it is up). Offsets move past complete lines only, and only once a reply has arrived whole, so
a dropped connection, a timeout or a console restart repeats nothing and loses nothing: the next poll asks
again from the same offsets. A worker that cannot be reached is retried with backoff (0.25 s doubling to
8 s) and shows as `unreachable` meanwhile. A file that does not exist yet reads as empty until it does. A
worker that is behind is polled again at once; one that is caught up, every `poll_s`.

`fail_fast`: when one worker has failed while others still run (they would hang in a collective), the
watch stops the survivors itself (TERM, then KILL), as `launch --fail-fast` asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from tpu_console.errors import UserError
from tpu_console.fleet import recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.base import Provider
from tpu_console.runs.events import Event, EventSummary, parse_event_line
from tpu_console.runs.health import Progress, RunHealth, Thresholds, assess
from tpu_console.runs.monitor import RunMonitor
from tpu_console.runs.probe import RunProbe, parse_probe
from tpu_console.runs.reach import reach_node
from tpu_console.runs.run_end import keep_run_end
from tpu_console.runs.run_id import check_run_id
from tpu_console.runs.signatures import Finding, SignatureScanner
from tpu_console.runs.store import RunRecord, RunStore, WorkerRecord
from tpu_console.runs.tail import LogChunk, TailCursor, parse_chunk
from tpu_console.secrets import SecretMasker

LOG, EVENTS = "output.log", "events.jsonl"
MAX_BACKOFF_S = 8.0
POLL_TIMEOUT_S = 70.0


# -- what a watch reports ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLines:
    worker: int
    lines: list[str]  # complete lines of output.log, masked, in order


@dataclass(frozen=True)
class NewEvents:
    worker: int
    events: list[Event]


@dataclass(frozen=True)
class SignatureFound:
    worker: int
    finding: Finding


@dataclass(frozen=True)
class HealthChanged:
    health: RunHealth


@dataclass(frozen=True)
class WatchEnded:
    health: RunHealth


Update = LogLines | NewEvents | SignatureFound | HealthChanged | WatchEnded


@dataclass
class WorkerStream:
    """One worker's side of the watch: read offsets, ring buffers, and counters."""

    worker: int
    ring_lines: int
    ring_events: int
    log: TailCursor = field(default_factory=TailCursor)
    events_cursor: TailCursor = field(default_factory=TailCursor)
    scanner: SignatureScanner = field(default_factory=SignatureScanner)
    lines: deque[str] = field(init=False)
    events: deque[Event] = field(init=False)
    lines_total: int = 0  # lines seen since the watch started (not only those still in the ring)
    events_total: int = 0
    failed_polls: int = 0  # polls that got no answer (connection dropped, timeout, unreachable)
    failing_since: float | None = None  # when the current run of failed polls began
    finished: bool = False  # the job ended and both files were read to their end

    def __post_init__(self) -> None:
        self.lines = deque(maxlen=self.ring_lines)
        self.events = deque(maxlen=self.ring_events)


# -- the watch -----------------------------------------------------------------------------------------


class RunWatch:
    def __init__(
        self,
        fleet: Fleet,
        record: RunRecord,
        *,
        workers: Sequence[int] | None = None,
        masker: SecretMasker | None = None,
        store: RunStore | None = None,
        poll_s: float = 0.25,
        health_every_s: float = 0.25,
        first_log_lines: int | None = None,
        max_bytes: int = 256 << 10,
        ring_lines: int = 5000,
        ring_events: int = 2000,
        fail_fast: bool = False,
        stop_grace_s: float = 10.0,
        lost_after_unreachable: int = 6,
        give_up_after_s: float = 120.0,
        archive: bool = True,
        thresholds: Thresholds | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`workers`: those to stream (default: every worker the run was launched on; the health always
        covers them all). `first_log_lines`: start each log at its last N lines instead of its beginning
        (events are always read whole, so the summaries are complete). `max_bytes`: per file per poll; with
        64 workers polled at once, what is in flight at a time stays around 64 x 2 x max_bytes. `store`: where the run's state is
        saved as it changes (None: not saved), and, with `archive`, where the run's archive and summary
        go when it has ended (runs/run_end.py)."""
        self.fleet = fleet
        self.record = record
        self.streamed = list(workers) if workers is not None else list(record.workers)
        self.masker = masker or SecretMasker()
        self.store = store
        self.poll_s = poll_s
        self.health_every_s = health_every_s
        self.first_log_lines = first_log_lines
        self.max_bytes = max_bytes
        self.fail_fast = fail_fast
        self.stop_grace_s = stop_grace_s
        self.thresholds = thresholds or Thresholds()
        self.give_up_after_s = give_up_after_s
        self.archive = archive
        self.clock = clock
        self.monitor = RunMonitor(record.run_id, record.workers, lost_after_unreachable)
        self.monitor.stop_requested = record.stop_requested_at is not None
        self.workers = {w: WorkerStream(w, ring_lines, ring_events) for w in record.workers}
        self.progress: dict[int, Progress] = {}
        self.survivors_stopped: list[int] = []  # workers fail-fast stopped
        self._on_update: Callable[[Update], object] | None = None
        self._queue: asyncio.Queue[Update] | None = None
        self._max_queued = 1000
        self._last_health: tuple | None = None
        self._saved_state: str | None = None
        self._stopping = asyncio.Event()
        self._stopper: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, providers: dict[str, Provider], run_id: str, store: RunStore | None = None, **options: object
    ) -> AsyncIterator[RunWatch]:
        """A watch on a run from the history, over a Fleet of its node that is closed on exit. Raises
        UserError when the node cannot be reached at all (deleted, not READY)."""
        store = store or RunStore()
        record = store.get(check_run_id(run_id))
        async with reach_node(providers, record.node) as reach:
            if reach.fleet is None:
                raise UserError(f"cannot watch {record.run_id}: {reach.problem}")
            options.setdefault("masker", SecretMasker.for_node(record.node))
            yield cls(reach.fleet, record, store=store, **options)  # type: ignore[arg-type]

    # -- running ---------------------------------------------------------------------------------------

    async def run(self, on_update: Callable[[Update], object] | None = None) -> RunHealth:
        """Watch until every worker's job has ended and its files are read to the end (or `stop()`).
        Returns the final health; `on_update` gets every update as it happens."""
        self._on_update = on_update
        ticker = asyncio.create_task(self._tick_health())
        try:
            await asyncio.gather(*(self._follow(w) for w in self.record.workers))
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
            if self._stopper is not None:
                await self._stopper
        health = self.health()
        self._save(health, final=True)
        if self.store is not None and self.ended and self.archive:
            # The run is over: copy its files home and keep its summary, before anyone deletes the node.
            await keep_run_end(self.fleet, self.store.get(self.record.run_id), self.store, self.monitor, self.masker)
        self._emit(HealthChanged(health))
        self._emit(WatchEnded(health))
        return health

    async def updates(self, max_queued: int = 1000) -> AsyncIterator[Update]:
        """Run the watch and yield its updates; ends after `WatchEnded`. A consumer that falls behind slows
        the reads (past `max_queued` updates waiting), it never loses lines."""
        queue: asyncio.Queue[Update] = asyncio.Queue()
        self._queue, self._max_queued = queue, max_queued
        task = asyncio.create_task(self.run())
        try:
            while True:
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done() and queue.empty():  # the watch ended without WatchEnded: it raised
                    getter.cancel()
                    task.result()  # raises the watch's exception here, in the consumer
                    break
                update = await getter
                yield update
                if isinstance(update, WatchEnded):
                    break
        finally:
            if not task.done():
                self.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stop(self) -> None:
        """End the watch soon (the jobs keep running)."""
        self._stopping.set()

    def health(self) -> RunHealth:
        return assess(self.monitor, self.progress, self.clock(), self.thresholds)

    @property
    def ended(self) -> bool:
        return all(self._worker_over(w) for w in self.record.workers)

    # -- one worker ------------------------------------------------------------------------------------

    async def _follow(self, worker: int) -> None:
        stream = self.workers[worker]
        backoff = self.poll_s
        streamed = worker in self.streamed
        if streamed and self.first_log_lines is not None:
            await self._read_last_lines(stream)
        while not self._stopping.is_set() and not self._worker_over(worker):
            # A worker whose log is not streamed is still probed and its events read (health covers all).
            offsets = {EVENTS: stream.events_cursor.offset}
            if streamed:
                offsets[LOG] = stream.log.offset
            command = recipes.watch_poll(self.record.run_id, offsets, self.max_bytes)
            parsed, problem = await self._poll(worker, command, set(offsets))
            if parsed is None:
                stream.failed_polls += 1
                if stream.failing_since is None:
                    stream.failing_since = self.clock()
                self.monitor.observe_unreachable(worker, problem)
                await self._sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff, stream.failing_since = self.poll_s, None
            probe, chunks = parsed
            status = self.monitor.observe(worker, probe)
            caught_up = chunks[EVENTS].end >= chunks[EVENTS].size and (
                not streamed or chunks[LOG].end >= chunks[LOG].size
            )
            final = caught_up and status.done
            if streamed:
                self._take_log(stream, chunks[LOG], final)
            self._take_events(stream, chunks[EVENTS], final)
            if final:
                stream.finished = True
            elif caught_up:
                await self._sleep(self.poll_s)

    async def _poll(
        self, worker: int, command: str, files: set[str]
    ) -> tuple[tuple[RunProbe, dict[str, LogChunk]] | None, str]:
        """One poll: its parsed reply, or None and why not. Never raises for one worker's trouble: a
        connection torn down in the middle of opening a channel can surface from asyncssh as an odd
        exception, and a poll stuck on a half-dead connection is cut off; both are a failed poll, retried."""
        try:
            async with asyncio.timeout(POLL_TIMEOUT_S):
                (result,) = await self.fleet.run(command, [worker], timeout=POLL_TIMEOUT_S - 10)
        except TimeoutError:
            return None, f"no answer within {POLL_TIMEOUT_S:g}s"
        except Exception as exc:  # noqa: BLE001 - see the docstring
            return None, f"poll failed: {type(exc).__name__}: {exc}"
        parsed = _parse_poll(result.stdout, self.record.run_id, files) if result.ok else None
        return parsed, result.error or _said(result.stderr, "poll failed")

    async def _read_last_lines(self, stream: WorkerStream) -> None:
        command = recipes.tail_log(self.record.run_id, lines=self.first_log_lines)
        (result,) = await self.fleet.run(command, [stream.worker], timeout=60)
        chunk = parse_chunk(result.stdout) if result.ok else None
        if chunk is not None:  # else: the polls start from the beginning
            self._take_log(stream, chunk, final=False)

    def _worker_over(self, worker: int) -> bool:
        """Nothing more will come from this worker: read to the end after its job ended, or unreachable
        for `give_up_after_s` while every other worker is over too."""
        stream = self.workers[worker]
        if stream.finished:
            return True
        if stream.failing_since is not None and self.clock() - stream.failing_since >= self.give_up_after_s:
            others = [w for w in self.record.workers if w != worker]
            return all(self.workers[w].finished or self.monitor.workers[w].done for w in others)
        return False

    def _take_log(self, stream: WorkerStream, chunk: LogChunk, final: bool) -> None:
        lines = stream.log.take(chunk, final=final)
        if not lines:
            return
        if self.masker:
            lines = [self.masker.mask(line) for line in lines]
        stream.lines.extend(lines)
        stream.lines_total += len(lines)
        self._emit(LogLines(stream.worker, lines))
        scan = stream.scanner.scan
        for line in lines:
            if (finding := scan(line)) is not None:
                self._emit(SignatureFound(stream.worker, finding))

    def _take_events(self, stream: WorkerStream, chunk: LogChunk, final: bool) -> None:
        lines = stream.events_cursor.take(chunk, final=final)
        if not lines:
            return
        mask = self.masker.mask if self.masker else None
        events = [e for line in lines if (e := parse_event_line(mask(line) if mask else line)) is not None]
        if not events:
            return
        summary: EventSummary = self.monitor.workers[stream.worker].events
        summary.add(events)
        stream.events.extend(events)
        stream.events_total += len(events)
        self._emit(NewEvents(stream.worker, events))

    # -- health ----------------------------------------------------------------------------------------

    async def _tick_health(self) -> None:
        while True:
            health = self.health()
            key = (health.verdict, tuple(h.label for h in health.workers.values()))
            if key != self._last_health:
                self._last_health = key
                self._save(health)
                self._emit(HealthChanged(health))
            if self.fail_fast and health.hung and self._stopper is None:
                self._stopper = asyncio.create_task(self._stop_survivors(list(health.hung)))
            await asyncio.sleep(self.health_every_s)

    async def _stop_survivors(self, workers: list[int]) -> None:
        """Fail fast: TERM (then KILL) the jobs still running after another worker failed."""
        self.survivors_stopped = workers
        await stop_survivors(self.fleet, self.record.run_id, workers, self.stop_grace_s)

    def _save(self, health: RunHealth, final: bool = False) -> None:
        if self.store is None or (health.state == self._saved_state and not final):
            return
        self._saved_state = health.state
        statuses = self.monitor.workers.values()
        self.store.update(
            self.record.run_id,
            health.state,
            [WorkerRecord(s.worker, str(s.state), s.pgid, None, s.exit_status) for s in statuses],
            failure=health.failure,
            finished=all(s.done for s in statuses),
        )

    # -- plumbing --------------------------------------------------------------------------------------

    def _emit(self, update: Update) -> None:
        if self._on_update is not None:
            self._on_update(update)
        if self._queue is not None:
            self._queue.put_nowait(update)  # unbounded, but the readers wait while it is long (_sleep)

    async def _sleep(self, seconds: float) -> None:
        # A consumer of `updates()` that falls behind holds the readers here: nothing is dropped, and
        # memory stays bounded (a poll adds at most a few updates per worker).
        while self._queue is not None and self._queue.qsize() > self._max_queued and not self._stopping.is_set():
            await asyncio.sleep(0.01)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)


async def stop_survivors(fleet: Fleet, run_id: str, workers: Sequence[int], grace_s: float = 10.0) -> list[str]:
    """TERM, then KILL after `grace_s`, the run's job on `workers` (the fail-fast action, also offered by
    `status` for a run whose other workers hang). Returns each worker's `stop_run` outcome line."""
    results = await fleet.run(recipes.stop_run(run_id, grace_s), list(workers), timeout=grace_s + 30)
    return [r.stdout.strip() or (r.error or "") for r in results]


def _parse_poll(stdout: str, run_id: str, files: set[str]) -> tuple[RunProbe, dict[str, LogChunk]] | None:
    """A `watch_poll` reply, or None when it is not whole (the command failed or was cut short)."""
    head, *sections = stdout.split(recipes.WATCH_SECTION)
    probe = parse_probe(head).get(run_id)
    if probe is None:
        return None
    chunks: dict[str, LogChunk] = {}
    for section in sections:
        name, _, body = section.partition("\n")
        chunk = parse_chunk(body)
        if chunk is None:
            return None
        chunks[name.strip()] = chunk
    if set(chunks) != files:
        return None
    return probe, chunks


def _said(stderr: str, default: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else default
