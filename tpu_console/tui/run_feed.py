"""The run dashboard's one source of data: turns what the runs layer says into typed messages.

Everything the dashboard shows comes through here, so the widgets stay pure (tests feed them fixed
messages) and a change in the runs layer is a change in this file only. Two loops, each run by the screen
as an exclusive Textual worker: `follow_status` probes the run (states, exit codes, the latest step of
every worker) until every worker's job is over, and `follow_logs` streams every worker's output.log.
Worker output is masked here, before any widget sees it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import datetime

from textual.message import Message

from tpu_console.errors import NotFound, one_line
from tpu_console.fleet import recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node
from tpu_console.runs import control
from tpu_console.runs.control import RunView
from tpu_console.runs.events import StepMetrics, parse_event_line
from tpu_console.runs.monitor import WorkerState, WorkerStatus
from tpu_console.runs.store import RunRecord, RunStore
from tpu_console.runs.tail import TailCursor, parse_chunk
from tpu_console.secrets import SecretMasker
from tpu_console.tui.messages import RunFeedProblem, RunLogLines, RunStepsArrived, RunUpdated
from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow, stalled_for

Post = Callable[[Message], object]

# wandb prints "View run at https://wandb.ai/<entity>/<project>/runs/<id>" from process 0.
_WANDB_URL = re.compile(r"https://wandb\.ai/\S+/runs/[\w-]+")


def local_now() -> datetime:
    return datetime.now().astimezone()


class RunFeed:
    def __init__(
        self,
        providers: dict[str, Provider],
        run_id: str,
        store: RunStore | None = None,
        *,
        clock: Callable[[], datetime] = local_now,
        status_every_s: float = 2.0,
        logs_every_s: float = 0.5,
        flush_every_s: float = 0.1,
        first_log_lines: int = 200,
        events_tail_bytes: int = control.STATUS_EVENTS_TAIL_BYTES,
    ) -> None:
        self.providers = providers
        self.run_id = run_id
        self.store = store
        self.clock = clock
        self.status_every_s = status_every_s
        self.logs_every_s = logs_every_s
        self.flush_every_s = flush_every_s
        self.first_log_lines = first_log_lines
        self.events_tail_bytes = events_tail_bytes
        self.masker = SecretMasker()
        self.wandb_url: str | None = None
        self._record: RunRecord | None = None
        self._pending_lines: list[tuple[int, str]] = []
        self._last_line: dict[int, str] = {}
        self._posted_step: dict[int, int] = {}
        self._progress: dict[int, tuple[int | None, float]] = {}  # worker -> (step, when it was first seen)
        self._events: dict[int, TailCursor] = {}  # how far each worker's events.jsonl has been read
        self._fleet: Fleet | None = None

    async def record(self) -> RunRecord:
        if self._record is None:
            store = self.store or await asyncio.to_thread(RunStore)
            self.store = store
            self._record = await asyncio.to_thread(store.get, self.run_id)
            # Values of the .env files uploaded to this node: masked in every line shown.
            self.masker = await asyncio.to_thread(SecretMasker.for_node, self._record.node)
        return self._record

    # -- status ----------------------------------------------------------------------------------------

    async def follow_status(self, post: Post) -> None:
        """Probe the run every `status_every_s` until every worker's job is over (that last look is the
        verdict). A probe that fails is reported and tried again; an unknown run id ends the loop."""
        delay = self.status_every_s
        while True:
            try:
                record = await self.record()
                (view,) = await control.observe(
                    self.providers, [record], self.store, self.events_tail_bytes, log_tail_lines=1
                )
            except NotFound as exc:
                post(RunFeedProblem(one_line(exc)))
                return
            except Exception as exc:  # noqa: BLE001 - shown on screen; the next probe may succeed
                post(RunFeedProblem(f"cannot read {self.run_id}: {one_line(exc)}"))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            delay = self.status_every_s
            await self.read_step_history(record, post)
            for message in self.messages_for(view):
                post(message)
            if all(w.done for w in view.workers):  # a gone node leaves its workers lost: done too
                await self.read_step_history(record, post)  # the steps written just before the end
                await self.close()
                return
            await asyncio.sleep(self.status_every_s)

    async def read_step_history(self, record: RunRecord, post: Post) -> None:
        """Every step event written since the last look, from each worker's events.jsonl by byte offset, so
        the plots have every step from step 1 (the status probe brings only each worker's latest)."""
        try:
            if self._fleet is None:
                provider, node = await find_node(self.providers, record.node)
                self._fleet = Fleet(await provider.ssh_targets(node))
            for worker in record.workers:
                cursor = self._events.setdefault(worker, TailCursor())
                command = recipes.tail_log(record.run_id, offset=cursor.offset, file="events.jsonl")
                (result,) = await self._fleet.run(command, [worker], timeout=30)
                chunk = parse_chunk(result.stdout) if result.ok else None
                if chunk is None:
                    continue
                events = [e for line in cursor.take(chunk) if (e := parse_event_line(line)) is not None]
                steps = [StepMetrics.from_event(e) for e in events if e.kind == "step"]
                if steps:
                    self._posted_step[worker] = max(self._posted_step.get(worker, 0), steps[-1].step)
                    post(RunStepsArrived(worker, steps))
        except Exception:  # noqa: BLE001 - the history is a nicety; the status probe reports real problems
            await self.close()

    async def close(self) -> None:
        if self._fleet is not None:
            fleet, self._fleet = self._fleet, None
            await fleet.close()

    def messages_for(self, view: RunView) -> list[Message]:
        """What one probe of the run adds to the dashboard."""
        now = self.clock()
        messages: list[Message] = []
        for status in view.workers:
            last = status.events.last_step
            if last is not None and self._posted_step.get(status.worker) != last.step:
                self._posted_step[status.worker] = last.step
                messages.append(RunStepsArrived(status.worker, [last]))
        messages.append(RunUpdated(self.snapshot(view, now)))
        messages.append(RunFeedProblem(view.problem))
        return messages

    def snapshot(self, view: RunView, now: datetime) -> RunSnapshot:
        failed = [s for s in view.workers if s.failed]
        first = min(failed, key=lambda s: (s.failed_at, s.worker)).worker if failed else None
        return RunSnapshot(
            run_id=view.record.run_id,
            node=view.record.node,
            state=view.state,
            workers=tuple(self._row(s, now.timestamp()) for s in view.workers),
            updated_at=now,
            failure=self.masker.mask(view.failure) if view.failure else None,
            first_failure=first,
            ended=all(s.done for s in view.workers),
            wandb_url=self.wandb_url,
            problem=view.problem,
        )

    def _row(self, status: WorkerStatus, now_s: float) -> WorkerRow:
        last = status.events.last_step
        step = last.step if last else None
        seen_step, since = self._progress.get(status.worker, (None, now_s))
        if step != seen_step or status.state is not WorkerState.RUNNING:
            since = now_s
        self._progress[status.worker] = (step, since)
        stalled = None
        if status.state is WorkerState.RUNNING and step is not None:
            stalled = stalled_for(since, now_s, last.step_avg_last10_s or last.step_s)
        line = self._last_line.get(status.worker) or (status.log_tail[-1] if status.log_tail else "")
        return WorkerRow(
            worker=status.worker,
            state=str(status.state),
            step=step,
            step_s=last.step_s if last else None,
            exit_status=status.exit_status,
            last_line=self.masker.mask(line),
            failed=status.failed,
            stalled_s=stalled,
            reason=status.reason,
            error=self.masker.mask(status.events.error_message) if status.events.error_message else None,
            mem_in_use_gib=last.mem_in_use_gib if last else None,
            mem_peak_gib=last.mem_peak_gib if last else None,
            mem_limit_gib=last.mem_limit_gib if last else None,
        )

    # -- logs ------------------------------------------------------------------------------------------

    async def follow_logs(self, post: Post) -> None:
        """Stream every worker's output.log (the last `first_log_lines` lines first) until every job is
        over, posting the lines in batches every `flush_every_s` so a fast log costs one message, not
        thousands."""
        flusher = asyncio.create_task(self._flush_every(post))
        try:
            await self.record()
            await control.logs(
                self.providers,
                self.run_id,
                self.take_line,
                lines=self.first_log_lines,
                follow=True,
                store=self.store,
                poll_s=self.logs_every_s,
            )
        except Exception as exc:  # noqa: BLE001 - shown on screen
            post(RunFeedProblem(f"cannot read the logs of {self.run_id}: {one_line(exc)}"))
        finally:
            flusher.cancel()
            self.flush(post)

    def take_line(self, worker: int, text: str) -> None:
        masked = self.masker.mask(text)
        if self.wandb_url is None and (match := _WANDB_URL.search(masked)):
            self.wandb_url = match.group(0)
        self._pending_lines.append((worker, masked))
        self._last_line[worker] = masked

    def flush(self, post: Post) -> None:
        if self._pending_lines:
            lines, self._pending_lines = self._pending_lines, []
            post(RunLogLines(lines))

    async def _flush_every(self, post: Post) -> None:
        while True:
            await asyncio.sleep(self.flush_every_s)
            self.flush(post)

