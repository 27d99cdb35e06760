"""Live watching of one run: every worker's `output.log` and `events.jsonl`, lossless, with the run's health.

The streaming API the CLI (`logs -f`) and the TUI's run dashboard build on:

    async with RunWatch.open(providers, run_id) as watch:      # or RunWatch(fleet, record) on a Fleet you
    hold
        async for update in watch.updates():                     # runs the watch until the run has ended
            match update:
                case LogLines(worker, lines): ...                 # complete, masked lines, in file order
                case NewEvents(worker, events): ...               # parsed events.jsonl lines
                (runs.events.Event)
                case SignatureFound(worker, finding): ...         # runs.signatures.Finding: OOM, TPU in use
                ...
                case HealthChanged(health): ...                   # runs.health.RunHealth: activities,
                verdict,
                                                                  # hung / stalled / straggler workers
                case WatchEnded(health): ...                      # the last update
    # or, without the iterator: `await watch.run(on_update=callback)`

Between updates the watch keeps, per worker (`watch.workers[i]`, a `WorkerStream`): a bounded ring buffer
of the latest log lines and events (memory stays bounded whatever the log size), the signature scanner
(first problem, W&B URL), and the byte offsets read up to. `watch.monitor` is the `RunMonitor`;
`watch.health()` judges it now; `watch.latest_health` is the last judgement, at most
`next_judgement_in` old.

How it reads: one long-lived follower per worker (worker/run_follower.py, started over the worker's
persistent connection, on the command channel once it is up) streams both files from the offsets read so
far, and the job's state every second, until the job has ended and the files are read to their end. A line
reaches the watch within about `poll_s` of being written, and nothing is asked per poll. Offsets move past
complete lines only (a cut-off line waits in the cursor for the rest), so a dropped connection, a silent
one (no heartbeat for SILENCE_S) or a console restart repeats nothing and loses nothing: the next follower
starts from the same offsets. A worker that cannot be reached is retried with backoff (`poll_s` doubling
to 8 s) and shows as `unreachable` meanwhile. A file that does not exist yet is waited for.

The watch only reads: stopping the other workers when one fails (`launch --fail-fast`) is the run's
supervisor's on the pod (worker/supervisor.py), which does it with no console watching.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace

from tpu_console.errors import UserError
from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.results import WorkerLine
from tpu_console.history.events import Event, EventSummary, parse_event_line
from tpu_console.history.run_id import check_run_id
from tpu_console.history.store import RunRecord, RunStore, WorkerRecord
from tpu_console.history.tail import TailCursor, parse_chunk_record
from tpu_console.observe.foreign_metrics import steps_read
from tpu_console.observe.health import Progress, RunHealth, Thresholds, assess
from tpu_console.observe.log_times import TIMES, LogTimes, line_times
from tpu_console.observe.monitor import RunMonitor
from tpu_console.observe.probe import RunProbe, probe_from_status
from tpu_console.observe.reach import reach_node
from tpu_console.observe.run_end import keep_run_end
from tpu_console.observe.signatures import Finding, SignatureScanner
from tpu_console.observe.supervision import DECISIONS_FILE, Decision, parse_decisions
from tpu_console.providers.base import Provider
from tpu_console.secrets import SecretMasker

LOG, EVENTS = "output.log", "events.jsonl"
SUPERVISOR = DECISIONS_FILE  # what the run's supervisor decided, on the run's first worker
MAX_BACKOFF_S = 8.0
PROBE_EVERY_S = 1.0  # the follower reports its job's state this often: the watch's heartbeat
SILENCE_S = 20.0  # a follower not heard from for this long is on a half-dead connection: start over
HEALTH_EVERY_S = 0.25  # how often the health is judged again
HEALTH_SHARE = 0.05  # of one core at most: a judgement that takes longer (a large pod) is made less often
RING_LINES, RING_EVENTS = 5000, 2000  # per worker, the latest log lines and events kept in memory
LOST_AFTER_UNREACHABLE = 6  # unreachable follows in a row before a worker counts as lost
GIVE_UP_AFTER_S = 120.0  # a worker unreachable this long, every other one over: nothing more will come
# How many updates may wait for a consumer of `updates()` before the followers are held: at least this many,
# and room for a few from every worker at once (a step event reaches every worker's events in one round).
MAX_QUEUED, QUEUED_PER_WORKER = 1000, 8


# -- what a watch reports ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLines:
    worker: int
    lines: list[str]  # complete lines of output.log, masked, in order
    # when each was written (unix s, the worker's clock), from the job runner's output.times; None for a
    # line newer than its last mark, and () from a job that writes no times
    times: tuple[float | None, ...] = ()


@dataclass(frozen=True)
class NewEvents:
    worker: int
    events: list[Event]


@dataclass(frozen=True)
class SignatureFound:
    worker: int
    finding: Finding


@dataclass(frozen=True)
class SupervisorDecided:
    decisions: list[Decision]  # new lines of the supervisor's record (observe/supervision.py)


@dataclass(frozen=True)
class HealthChanged:
    health: RunHealth


@dataclass(frozen=True)
class WatchEnded:
    health: RunHealth


Update = LogLines | NewEvents | SignatureFound | SupervisorDecided | HealthChanged | WatchEnded


@dataclass
class _Follow:
    """One follower's run on one worker, as the watch saw it."""

    heard: float  # when its last record arrived (the event loop's clock)
    records: int = 0
    ended: bool = False  # it said the job is over and its files were read to the end
    said: str = ""  # its last stderr line (why it did not start: no python3 there, say)
    problem: str | None = None  # why it broke off


@dataclass
class WorkerStream:
    """One worker's side of the watch: read offsets, ring buffers, and counters."""

    worker: int
    ring_lines: int
    ring_events: int
    log: TailCursor = field(default_factory=TailCursor)
    events_cursor: TailCursor = field(default_factory=TailCursor)
    decisions_cursor: TailCursor = field(default_factory=TailCursor)
    times_cursor: TailCursor = field(default_factory=TailCursor)
    log_times: LogTimes = field(default_factory=LogTimes)  # when its log's lines were written
    scanner: SignatureScanner = field(default_factory=SignatureScanner)
    lines: deque[str] = field(init=False)
    events: deque[Event] = field(init=False)
    lines_total: int = 0  # lines seen since the watch started (not only those still in the ring)
    events_total: int = 0
    broken_follows: int = 0  # followers that broke off (connection dropped, silent, unreachable)
    held_back: int = 0  # followers stopped because the consumer of `updates()` fell behind
    failing_since: float | None = None  # when the current run of broken follows began
    finished: bool = False  # the job ended and both files were read to their end
    log_placed: bool = False  # a follower said where in the log it starts (its last lines, at first)
    heartbeat: str = ""  # the follower's last heartbeat (`P` record) as it came, and what it said
    probe: RunProbe | None = None

    def __post_init__(self) -> None:
        self.lines = deque(maxlen=self.ring_lines)
        self.events = deque(maxlen=self.ring_events)


def next_judgement_in(spent_s: float, every_s: float = HEALTH_EVERY_S) -> float:
    """Seconds until the health is judged again, after a judgement that took `spent_s` of CPU: every
    `every_s`, or less often where judging would take more than HEALTH_SHARE of a core (it grows with the
    workers: a judgement looks at every one)."""
    return max(every_s, spent_s / HEALTH_SHARE)


def _masked(masker: SecretMasker, lines: list[str]) -> list[str]:
    """Each line masked: the chunk in one pass, unless a secret holding a newline matched across lines
    (then the lines would not be the same lines: each is masked on its own)."""
    masked = masker.mask("\n".join(lines)).split("\n")
    return masked if len(masked) == len(lines) else [masker.mask(line) for line in lines]


async def _until_silent(follow: _Follow, loop: asyncio.AbstractEventLoop) -> None:
    """Returns once the follower has sent nothing for SILENCE_S: it sleeps until then, and again as long
    as records keep moving the deadline (a wake-up per worker every SILENCE_S, not per record)."""
    while (left := follow.heard + SILENCE_S - loop.time()) > 0:
        await asyncio.sleep(left)


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
        first_log_lines: int | None = None,
        max_bytes: int = 256 << 10,
    ) -> None:
        """`workers`: those to stream (default: every worker the run was launched on; the health always
        covers them all). `first_log_lines`: start each log at its last N lines instead of its beginning
        (events are always read whole, so the summaries are complete). `max_bytes`: the most a follower sends
        in one chunk. `poll_s`: how often a caught-up follower looks at the files again. `store`: where the
        run's state is
        saved as it changes (None: not saved), and where the run's archive and summary go when it has
        ended (observe/run_end.py)."""
        self.fleet = fleet
        self.record = record
        self.streamed = list(workers) if workers is not None else list(record.workers)
        self.masker = masker or SecretMasker()
        self.store = store
        self.poll_s = poll_s
        self.health_every_s = HEALTH_EVERY_S
        self.first_log_lines = first_log_lines
        self.max_bytes = max_bytes
        self.thresholds = Thresholds()
        if not steps_read(record):  # a program whose steps are unknown: no step for long is no hang
            self.thresholds = replace(self.thresholds, silent_s=math.inf)
        self.give_up_after_s = GIVE_UP_AFTER_S
        self.clock: Callable[[], float] = time.monotonic
        self.monitor = RunMonitor(record.run_id, record.workers, LOST_AFTER_UNREACHABLE)
        self.monitor.note_stop(record.stop_requested_at)
        self.workers = {w: WorkerStream(w, RING_LINES, RING_EVENTS) for w in record.workers}
        self.decisions: list[Decision] = []  # the run's supervisor's record, as read so far
        self.progress: dict[int, Progress] = {}
        self._on_update: Callable[[Update], object] | None = None
        self._queue: asyncio.Queue[Update] | None = None
        self._max_queued = MAX_QUEUED
        self._last_health: tuple | None = None
        self.latest_health: RunHealth | None = None  # the last judgement (`health()` judges afresh)
        self._saved_state: str | None = None
        self._stopping = asyncio.Event()
        self._behind = asyncio.Event()  # set while the consumer of `updates()` is behind: followers hold
        self._caught_up = asyncio.Event()  # set once it has caught up again: held followers start again

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
        health = self.health()
        self._save(health, final=True)
        if self.store is not None and self.ended:
            # The run is over: copy its files home and keep its summary, before anyone deletes the node.
            await keep_run_end(
                self.fleet, self.store.get(self.record.run_id), self.store, self.monitor, self.masker
            )
        self._emit(HealthChanged(health))
        self._emit(WatchEnded(health))
        return health

    async def updates(self, max_queued: int | None = None) -> AsyncIterator[Update]:
        """Run the watch and yield its updates; ends after `WatchEnded`. A consumer that falls behind slows
        the reads (past `max_queued` updates waiting; by default MAX_QUEUED, or QUEUED_PER_WORKER per
        worker on a large pod), it never loses lines."""
        queue: asyncio.Queue[Update] = asyncio.Queue()
        self._queue = queue
        self._max_queued = max_queued or max(MAX_QUEUED, QUEUED_PER_WORKER * len(self.record.workers))
        task = asyncio.create_task(self.run())
        try:
            while True:
                if queue.empty():  # wait for the next one; the updates already queued are taken as they are
                    getter = asyncio.ensure_future(queue.get())
                    await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done() and queue.empty():  # the watch ended without WatchEnded: it raised
                        getter.cancel()
                        task.result()  # raises the watch's exception here, in the consumer
                        break
                    update = await getter
                else:
                    update = queue.get_nowait()
                if self._behind.is_set() and queue.qsize() <= self._max_queued:
                    self._behind.clear()
                    self._caught_up.set()
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
        while not self._stopping.is_set() and not self._worker_over(worker):
            await self._sleep(0)  # a consumer of `updates()` that fell behind holds the follower here
            follow = await self._follow_once(stream, streamed)
            if follow.ended:
                stream.finished = True
            elif follow.problem is not None:
                stream.broken_follows += 1
                if follow.records:  # it streamed for a while: the connection broke now, try again soon
                    backoff, stream.failing_since = self.poll_s, None
                if stream.failing_since is None:
                    stream.failing_since = self.clock()
                self.monitor.observe_unreachable(worker, follow.problem)
                await self._sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            # else it was stopped on purpose (the watch stops, or its consumer fell behind)

    async def _follow_once(self, stream: WorkerStream, streamed: bool) -> _Follow:
        """Run one follower on the worker until it ends (the job is over and read: `ended`), breaks off
        (`problem` says why), or is stopped here: when the watch stops, when its consumer falls behind,
        or when it has been silent for SILENCE_S. Never raises for one worker's trouble: a connection torn
        down in the middle of opening a channel can surface from asyncssh as an odd exception."""
        offsets = {EVENTS: stream.events_cursor.offset}
        last_lines = {}
        if streamed and not stream.log_placed and self.first_log_lines is not None:
            # the follower starts at the log's last lines and says where: no command of its own to find it;
            # the times first, so that the lines find their marks (a mark covers one line or more)
            last_lines[TIMES] = 4 * self.first_log_lines + 8
            last_lines[LOG] = self.first_log_lines
        elif streamed:  # a worker whose log is not streamed still has its events read (health covers all)
            offsets[TIMES] = stream.times_cursor.offset
            offsets[LOG] = stream.log.offset
        if stream.worker == self.record.workers[0]:  # where the run's supervisor writes
            offsets[SUPERVISOR] = stream.decisions_cursor.offset
        follower = run_recipes.follow_run(self.record.run_id, offsets, self.poll_s, PROBE_EVERY_S,
                                          self.max_bytes, last_lines=last_lines)
        loop = asyncio.get_running_loop()
        follow = _Follow(heard=loop.time())

        def on_line(line: WorkerLine) -> None:
            if line.stream == "stderr":
                follow.said = line.text.strip() or follow.said
            elif not follow.ended:
                follow.heard = loop.time()
                follow.records += 1
                self._take_record(stream, line.text, follow)

        task = asyncio.ensure_future(self.fleet.follow(follower, stream.worker, on_line))
        stopping = asyncio.ensure_future(self._stopping.wait())
        behind = asyncio.ensure_future(self._behind.wait())
        silent = asyncio.ensure_future(_until_silent(follow, loop))
        try:
            # No timeout here: a wake-up per worker per second is thousands a second on a large pod.
            await asyncio.wait({task, stopping, behind, silent}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                stream.held_back += behind.done() and not stopping.done()
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                if silent.done() and not (stopping.done() or behind.done()):
                    follow.problem = f"no answer within {SILENCE_S:g}s"
                return follow
            result = task.result()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            follow.problem = f"follow failed: {type(exc).__name__}: {exc}"
            return follow
        finally:
            stopping.cancel()
            behind.cancel()
            silent.cancel()
        if not follow.ended:
            follow.problem = (
                result.error
                or follow.said
                or (f"the follower exited {result.exit_status} before the job ended")
            )
            if result.exit_status == 127:  # the shell found no python3
                follow.problem += " (following a run needs python3 on the worker's PATH)"
        return follow

    def _take_record(self, stream: WorkerStream, text: str, follow: _Follow) -> None:
        """One record of the follower (worker/run_follower.py says what each means)."""
        kind, _, fields = text.partition(" ")
        if kind == "C":
            parsed = parse_chunk_record(fields)
            if parsed is not None:  # else cut short: the next follower reads it again
                name, chunk = parsed
                if name == LOG:
                    stream.log_placed = True
                    self._take_log_lines(stream, stream.log.take(chunk))
                elif name == TIMES:
                    stream.log_times.add(stream.times_cursor.take(chunk))
                elif name == EVENTS:
                    self._take_event_lines(stream, stream.events_cursor.take(chunk))
                elif name == SUPERVISOR:
                    self._take_decisions(stream.decisions_cursor.take(chunk))
        elif kind == "P":
            # the follower's first write places the log (its `C` record, if the log exists, comes first):
            # from here on its offset is the cursor's, also when the log did not exist (0)
            stream.log_placed = True
            if fields != stream.heartbeat or stream.probe is None:  # the same as the last: read once
                stream.heartbeat, stream.probe = fields, probe_from_status(self.record.run_id, fields)
            self.monitor.observe(stream.worker, stream.probe)
        elif kind == "E":
            follow.ended = True
            stream.log_times.add(stream.times_cursor.finish())
            self._take_log_lines(stream, stream.log.finish())
            self._take_event_lines(stream, stream.events_cursor.finish())
            self._take_decisions(stream.decisions_cursor.finish())

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

    def _take_log_lines(self, stream: WorkerStream, lines: list[str]) -> None:
        if not lines:
            return
        times = line_times(stream.log_times, stream.log.offset, lines)
        if self.masker:
            lines = _masked(self.masker, lines)
        stream.lines.extend(lines)
        stream.lines_total += len(lines)
        # the failure's detail, as a probe's log tail gives it to `status` (RunMonitor.failure_message)
        status = self.monitor.workers[stream.worker]
        status.log_tail = (status.log_tail + lines)[-3:]
        self._emit(LogLines(stream.worker, lines, times))
        for finding in stream.scanner.scan_lines(lines):
            self._emit(SignatureFound(stream.worker, finding))

    def _take_decisions(self, lines: list[str]) -> None:
        if decisions := parse_decisions("\n".join(lines)):
            self.decisions.extend(decisions)
            self._emit(SupervisorDecided(decisions))

    def _take_event_lines(self, stream: WorkerStream, lines: list[str]) -> None:
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
            started = time.thread_time()
            health = self.latest_health = self.health()
            spent = time.thread_time() - started
            key = (health.verdict, tuple(h.label for h in health.workers.values()))
            if key != self._last_health:
                self._last_health = key
                self._save(health)
                self._emit(HealthChanged(health))
            await asyncio.sleep(next_judgement_in(spent, self.health_every_s))

    def _save(self, health: RunHealth, final: bool = False) -> None:
        if self.store is None or (health.state == self._saved_state and not final):
            return
        self._saved_state = health.state
        statuses = self.monitor.workers.values()
        self.store.update(
            self.record.run_id,
            health.state,
            [WorkerRecord(s.worker, str(s.state), s.pgid, None, s.exit_status, s.exit_time)
             for s in statuses],
            failure=health.failure,
            finished=all(s.done for s in statuses),
        )

    # -- plumbing --------------------------------------------------------------------------------------

    def _emit(self, update: Update) -> None:
        if self._on_update is not None:
            self._on_update(update)
        if self._queue is not None:
            self._queue.put_nowait(update)  # unbounded, but the followers hold while it is long (_sleep)
            if self._queue.qsize() > self._max_queued and not self._behind.is_set():
                self._caught_up.clear()
                self._behind.set()

    async def _sleep(self, seconds: float) -> None:
        # A consumer of `updates()` that falls behind holds the followers here (the ones streaming when it
        # fell behind were stopped, `_follow_once`) until it has caught up (`updates`): nothing is dropped,
        # and memory stays bounded.
        if self._behind.is_set() and not self._stopping.is_set():
            stopping = asyncio.ensure_future(self._stopping.wait())
            caught_up = asyncio.ensure_future(self._caught_up.wait())
            await asyncio.wait({stopping, caught_up}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            caught_up.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
