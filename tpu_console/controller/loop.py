"""The controller's reconcile loop: every pass, for each managed run in the store, one idempotent step
toward "the run is running on a node of its shape", taken only while this controller holds the lease.

The loop is a journal: each run's `intent` (state.py) names the action about to be taken, and is written
(compare-and-swap on the run's generation) before the action is. A controller killed between any two of
its actions and started again (here or elsewhere) finds the intent and takes it again; every action first
looks at what is there, so taking it twice changes nothing:

- watch: read the node and the run (observe.py) and judge (judge.py): wait, end, or recover;
- delete, create (incarnation n), and sweep: the actions on the node itself (node_actions.py);
- prepare: bootstrap, sync the same code, run the same setup (relaunch.py); then, when the run's `doctor`
  is on, the pod doctor (doctor/check.py) on the new node: a finding makes the node again (a recovery of
  the budget: delete, create) or, the budget spent, gives up with the doctor's line;
- launch: adopt a run already started on the node since the incarnation began, else launch the job again;
- shrink and grow (a multislice run that is `elastic`, judge.py): a slice lost, the run on the node goes
  on at once on the slices left, as a new incarnation on the same node (launch: the old run stopped, with
  its checkpoint on SIGTERM, and the job launched on those slices, elastic.py); meanwhile the lost slices
  are made again where the provider can (a local pod; the TPU API makes a multislice whole or not at
  all); once every slice reads READY and the run on fewer has made a step, it grows back the same way; a
  grow that fails (its launch, or its run before its first step) goes back onto the slices it was on and
  is tried again later (elastic.next_grow_at);
- cancel (`controller cancel`): the live run stopped, then the sweep (after a give-up or a cancel, for
  `sweep_s`: a request filled late is deleted when it appears; once after a success).

Nothing is deleted on a read that failed or timed out, and a node is touched only when it is this run's
(judge.not_ours). Each remote action (delete, create, prepare, launch) is begun only while the lease is
held, and every state write is a compare-and-swap, so a controller that lost the lease acts no further.
`launch --recover` runs this same loop in the foreground for one run (`only`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection
from typing import Any

from tpu_console.controller import elastic, env_copies, relaunch
from tpu_console.controller import state as st
from tpu_console.controller.judge import Verdict, judge, not_ours, usable
from tpu_console.controller.lease import TTL_S, Lease
from tpu_console.controller.node_actions import DOCTOR, NodeActions
from tpu_console.controller.observe import (
    LOST_STATES,
    NodeReading,
    read_node,
    read_run,
    read_start,
    runs_since,
)
from tpu_console.controller.state import Action, Incarnation, Recovery, Status, Stored
from tpu_console.controller.store import Conflict, StateStore
from tpu_console.doctor import check as doctor
from tpu_console.domain import Node
from tpu_console.errors import one_line
from tpu_console.history.store import RunStore
from tpu_console.launch.stop import stop
from tpu_console.providers.base import Progress, Provider, no_progress

STEPS_PER_PASS = 8  # actions one run may take in a row before the next look at the others
PREPARE_TRIES = 3
LAUNCH_TRIES = 3


class Controller(NodeActions):
    def __init__(
        self,
        providers: dict[str, Provider],
        store: StateStore,
        *,
        poll_s: float = 10.0,
        read_timeout_s: float = 30.0,
        lease_ttl_s: float = TTL_S,
        sweep_s: float = 3600.0,
        where: str | None = None,
        webhook_url: str | None = None,
        notify: Callable[[str, str], None] = lambda _event, _text: None,
        progress: Progress = no_progress,
        only: Collection[str] | None = None,
        run_store: RunStore | None = None,
    ) -> None:
        self.providers, self.store = providers, store
        self.poll_s, self.read_timeout_s, self.sweep_s = poll_s, read_timeout_s, sweep_s
        self.lease = Lease(store, lease_ttl_s, where)
        self.webhook_url, self.notify, self.progress = webhook_url, notify, progress
        self.only = set(only) if only is not None else None
        self.run_store = run_store or RunStore()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.actions: list[tuple[str, str, int]] = []  # (run, action, incarnation) taken, in order

    @property
    def id(self) -> str:
        return self.lease.holder["id"]

    # ---- the loop --------------------------------------------------------------------------------------

    async def serve(self, until: Callable[[], bool] | None = None, wake: asyncio.Event | None = None) -> None:
        """Pass after pass, every `poll_s`, until `until()` says so (forever without it); `wake` set ends
        the wait between two passes at once (a daemon's SIGTERM)."""
        wake = wake or asyncio.Event()
        try:
            while True:
                await self.run_pass()
                if until is not None and until():
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.poll_s)
        finally:
            await self.stop()

    async def run_pass(self) -> None:
        """Renew the lease; while held, start a step for each run that wants one and has none under way."""
        held = await asyncio.to_thread(self.lease.acquire)
        for run_id, task in list(self._tasks.items()):
            if task.done():
                del self._tasks[run_id]
                if not task.cancelled() and task.exception() is not None:
                    self.progress(f"{run_id}: {one_line(task.exception())}")
        if not held:
            await self._cancel_all()
            return
        for stored in await asyncio.to_thread(st.all_runs, self.store):
            run = stored.run
            if self.only is not None and run.id not in self.only:
                continue
            if run.state.terminal and not run.intent:
                env_copies.forget(run.id)  # its secrets are needed here no more
                continue
            if run.id not in self._tasks:
                self._tasks[run.id] = asyncio.create_task(self._advance(run.id))

    async def wait_idle(self) -> None:
        """Until every step under way has finished (the foreground loop, and tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            self._tasks = {k: t for k, t in self._tasks.items() if not t.done()}

    async def stop(self) -> None:
        await self._cancel_all()
        await asyncio.to_thread(self.lease.release)

    async def _cancel_all(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

    async def _advance(self, run_id: str) -> None:
        for _ in range(STEPS_PER_PASS):
            if not self.lease.held:
                return
            stored = await asyncio.to_thread(st.load, self.store, run_id)
            if stored is None:
                return
            try:
                if await self.step(stored):
                    return
            except Conflict:
                return  # written by someone else since it was read: the next pass reads it again

    async def step(self, stored: Stored) -> bool:
        """Take the run's next action; True when it waits for the next pass."""
        run = stored.run
        if run.stop_requested and not run.state.terminal:
            await self._cancel(stored)
            return False
        if not run.intent:
            if run.state.terminal:
                return True
            await self._intend(stored, Action.WATCH, run.current.n)
        action = Action(run.intent["action"])
        if (why := await asyncio.to_thread(relaunch.blocked, run, action, self.store)) is not None:
            if run.note != why:  # it waits for the fix the note names: said once
                run.note = why
                await self._save(stored)
                self.progress(f"{run.id}: waits: {why}")
            return True
        handler = {Action.WATCH: self._watch, Action.DELETE: self._delete, Action.CREATE: self._create,
                   Action.PREPARE: self._prepare, Action.LAUNCH: self._launch, Action.SWEEP: self._sweep}
        return await handler[action](stored)

    # ---- journal ---------------------------------------------------------------------------------------

    async def _save(self, stored: Stored) -> None:
        await asyncio.to_thread(st.save, self.store, stored)

    async def _intend(self, stored: Stored, action: Action, n: int, **extra: Any) -> None:
        """Write the next action before it is taken (the journal); Conflict if someone wrote meanwhile."""
        stored.run.intent = {"action": action.value, "n": n, "at": time.time(), "by": self.id, **extra}
        await self._save(stored)
        self.actions.append((stored.run.id, action.value, n))

    async def _give_up(self, stored: Stored, why: str) -> None:
        run = stored.run
        run.status, run.note = Status.GAVE_UP.value, why
        run.sweep_until = time.time() + self.sweep_s
        await self._intend(stored, Action.SWEEP, len(run.incarnations))
        self.progress(f"{run.id}: gave up: {why}")
        self.notify("gave-up", f"managed run {run.id} on {run.node}: gave up: {why}")

    def _provider(self, stored: Stored) -> Provider:
        return self.providers[stored.run.provider]

    async def _read_node(self, stored: Stored) -> NodeReading:
        return await read_node(self._provider(stored), stored.run.node, self.read_timeout_s)

    # ---- actions ---------------------------------------------------------------------------------------

    async def _watch(self, stored: Stored) -> bool:
        run, inc = stored.run, stored.run.current
        node = await self._read_node(stored)
        reading = None
        if node.node is not None and usable(run, node) and inc.run_id:
            if (why := not_ours(run, node.node, inc.n)) is not None:
                await self._give_up(stored, f"{why}; it is left alone")
                return False
            reading = await read_run(self.providers, inc.run_id, self.read_timeout_s, self.run_store)
            if reading.last_step is not None:
                if inc.last_step is None or reading.last_step > inc.last_step:
                    inc.last_step, inc.last_step_at = reading.last_step, reading.at
                if inc.first_step_at is None:
                    await self._first_step(stored, node, reading.at)
        verdict = judge(run, node, reading)
        if verdict.action in ("end", "back"):
            # the node is read again after the run: a preemption between the two reads ends the jobs on a
            # node that read READY a moment before, and is no end of the run
            again = await self._read_node(stored)
            if not usable(run, again):
                verdict = judge(run, again, None)
        run.heartbeat = {"at": time.time(), "by": self.id}
        if verdict.action == "wait":
            if inc.slices is not None and node.node is not None:
                await self._remake_slices(stored, node.node)
            await self._save(stored)
            return True
        if verdict.action in ("shrink", "grow"):
            return await self._resize(stored, verdict)
        if verdict.action == "back":
            return await self._grow_failed(stored, str(verdict.reason), inc.run_id)
        inc.ended, inc.ended_at = verdict.reason, (run.suspect or {}).get("first_at") or time.time()
        if verdict.action == "end":
            run.status, run.note, run.intent = verdict.status.value, verdict.reason, None
            if verdict.status is Status.SUCCEEDED and inc.n > 0:
                # the node the controller made goes with the run, in one sweep (a failed run's stays)
                run.sweep_until = time.time()
                await self._intend(stored, Action.SWEEP, len(run.incarnations))
                return False
            await self._save(stored)
            self.progress(f"{run.id}: {inc.run_id} {verdict.reason} on {run.node}")
            return True
        suspect = run.suspect or {"first_at": node.at}
        if (why := run.budget_left(time.time())) is not None:
            await self._give_up(stored, f"the node was {verdict.reason}; {why}")
            return False
        run.recoveries.append(Recovery(
            n=len(run.incarnations), reason=str(verdict.reason), detected_at=float(suspect["first_at"]),
            confirmed_at=time.time(), last_step_before=inc.last_step))
        run.status, run.suspect, run.lost_since, run.killed_reads = Status.RECOVERING.value, None, None, 0
        self.progress(f"{run.id}: {run.node} {verdict.reason}: recovering ({len(run.recoveries)} of at most "
                      f"{run.max_recoveries})")
        self.notify("preempted", f"managed run {run.id}: {run.node} {verdict.reason} during run "
                    f"{inc.run_id}; " + ("relaunching on it" if verdict.in_place else
                                         "recreating it and relaunching"))
        if verdict.in_place:  # the node stayed: its next incarnation is itself, nothing deleted or made
            run.recoveries[-1].deleted_at = run.recoveries[-1].confirmed_at
            return await self._created(stored, inc.zone)
        await self._intend(stored, Action.DELETE, inc.n)
        return False

    async def _first_step(self, stored: Stored, node: NodeReading, seen_at: float) -> None:
        run, inc = stored.run, stored.run.current
        assert node.node is not None and inc.run_id is not None
        first = inc.on_slices(run.slices)[0] * node.node.workers_per_slice  # the run's first worker
        marks = await read_start(self._provider(stored), node.node, inc.run_id, self.read_timeout_s, first)
        if marks.first_step is None:
            return
        at = marks.first_step_at
        plausible = at is not None and (inc.started_at or 0) - 60 <= at <= seen_at + 60  # the job's clock
        held_back = elastic.grow_note(run)
        inc.first_step_at, inc.resumed_step = at if plausible else seen_at, marks.resumed_step
        if run.note is not None and run.note == held_back:
            run.note = elastic.grow_note(run)  # a grow that held: failed grows no longer hold the run back
        recovery = next((r for r in run.recoveries if r.n == inc.n), None)
        if recovery is not None:
            recovery.first_step_at, recovery.resumed_step = inc.first_step_at, inc.resumed_step
            seconds = recovery.seconds
            self.notify("recovered", f"managed run {run.id}: {inc.run_id} on {run.node} ({inc.zone or '-'}) "
                        f"resumed after step {inc.resumed_step}, {recovery.steps_lost} step(s) lost, "
                        f"{seconds:.0f} s from the loss to its first step")

    async def _resize(self, stored: Stored, verdict: Verdict) -> bool:
        """A multislice run onto other slices of its node: a new incarnation there, launched next (the
        old run stopped first). A shrink is a recovery, of the budget; a grow is not."""
        run, inc = stored.run, stored.run.current
        now = time.time()
        first_at = float((run.suspect or {}).get("first_at") or now)
        inc.ended, inc.ended_at = verdict.reason, first_at
        run.suspect = None
        if verdict.action == "shrink":
            if (why := run.budget_left(now)) is not None:
                await self._give_up(stored, f"{verdict.reason}; {why}")
                return False
            run.recoveries.append(Recovery(
                n=len(run.incarnations), reason=str(verdict.reason), detected_at=first_at, confirmed_at=now,
                deleted_at=now, created_at=now, prepared_at=now, last_step_before=inc.last_step,
                zone=inc.zone))
            run.status = Status.RECOVERING.value
        whole = len(verdict.slices) == run.slices
        run.incarnations.append(Incarnation(len(run.incarnations), run.node, inc.zone, created_at=now,
                                            slices=None if whole else list(verdict.slices)))
        self.progress(f"{run.id}: {verdict.reason}: relaunching {inc.run_id} on slice(s) "
                      f"{', '.join(map(str, verdict.slices))} of {run.node}")
        self.notify("preempted" if verdict.action == "shrink" else "grown",
                    f"managed run {run.id}: {run.node} {verdict.reason}; going on on "
                    f"{len(verdict.slices)} of {run.slices} slices")
        await self._intend(stored, Action.LAUNCH, run.current.n, stop=inc.run_id)
        return False

    async def _grow_failed(self, stored: Stored, problem: str, grown: str | None) -> bool:
        """A grow on trial failed (its launch, or its run `grown` before the first step): the run launched
        again on the slices it was on, as a new incarnation, the grown run stopped first (or, when none
        started, the run before it, should its stop have failed); the grow is tried again after a back-off
        (elastic.next_grow_at). No recovery of the budget."""
        run, inc = stored.run, stored.run.current
        back = elastic.before_grow(run)
        running = grown or run.incarnations[-2].run_id
        now = time.time()
        inc.run_id = inc.run_id or grown  # so the relaunch never adopts it
        inc.ended, inc.ended_at = f"{elastic.GROW_FAILED}: {problem}", now
        run.incarnations.append(Incarnation(len(run.incarnations), run.node, inc.zone, created_at=now,
                                            slices=list(back)))
        run.status, run.suspect, run.killed_reads = Status.RUNNING.value, None, 0
        run.note = elastic.grow_note(run)
        self.progress(f"{run.id}: growing {run.node} back to {run.slices} slices failed: {problem}; "
                      f"relaunching on slice(s) {', '.join(map(str, back))}")
        self.notify("grow-failed", f"managed run {run.id}: {run.note}")
        await self._intend(stored, Action.LAUNCH, run.current.n, stop=running)
        return False

    async def _remake_slices(self, stored: Stored, node: Node) -> None:
        """Make the node's lost slices again while the run is on the others, where the provider can."""
        run = stored.run
        for index, state in enumerate(node.slice_states):
            if state not in LOST_STATES or not self.lease.held:
                continue
            try:
                await self._provider(stored).recreate_slice(run.node, index, self.progress)
            except Exception as exc:  # noqa: BLE001 - it cannot (gcp), or failed: said, tried next pass
                run.note = f"slice {index} not made again: {one_line(exc)}"

    async def _prepare(self, stored: Stored) -> bool:
        run = stored.run
        recovery = run.recoveries[-1] if run.recoveries and run.recoveries[-1].n == run.current.n else None

        def bootstrapped() -> None:
            if recovery is not None:
                recovery.bootstrapped_at = time.time()

        if not self.lease.held:
            return True
        try:
            await relaunch.prepare(self.providers, run.node, run.job, run.project, run.setup, self.progress,
                                   bootstrapped, self.store)
        except Exception as exc:  # noqa: BLE001 - a worker not up yet, a network error: a few tries
            return await self._failed(stored, Action.PREPARE, PREPARE_TRIES, f"preparing {run.node}",
                                      "prepare", one_line(exc))
        if recovery is not None:
            recovery.prepared_at = time.time()
        if run.doctor:
            try:
                report = await doctor.check_node(self.providers, run.node, python=run.job.get("python"),
                                                 progress=self.progress)
            except Exception as exc:  # noqa: BLE001 - the node not READY now, a network error: a few tries
                return await self._failed(stored, Action.PREPARE, PREPARE_TRIES, f"checking {run.node}",
                                          "the pod doctor", one_line(exc))
            if not report.ok:
                return await self._unfit(stored, report.lines()[0])
            if recovery is not None:
                recovery.checked_at = time.time()
        await self._intend(stored, Action.LAUNCH, run.current.n)
        return False

    async def _unfit(self, stored: Stored, finding: str) -> bool:
        """The doctor's finding on the new node: the node made again, as a recovery of the budget, or the
        run given up with the finding once the budget is spent."""
        run, inc = stored.run, stored.run.current
        now = time.time()
        inc.ended, inc.ended_at = f"{DOCTOR}: {finding}", now
        self.progress(f"{run.id}: {DOCTOR} on {run.node}: {finding}")
        if (why := run.budget_left(now)) is not None:
            await self._give_up(stored, f"{DOCTOR} on {run.node}: {finding}; {why}")
            return False
        before = run.recoveries[-1].last_step_before if run.recoveries else inc.last_step
        run.recoveries.append(Recovery(n=len(run.incarnations), reason=f"{DOCTOR}: {finding}",
                                       detected_at=now, confirmed_at=now, last_step_before=before))
        run.note = f"{DOCTOR} on {run.node}: {finding}; making it again"
        self.notify("doctor", f"managed run {run.id}: {DOCTOR} on {run.node}: {finding}; making it again")
        await self._intend(stored, Action.DELETE, inc.n)
        return False

    async def _launch(self, stored: Stored) -> bool:
        run, inc = stored.run, stored.run.current
        node = await self._read_node(stored)
        if not node.known:
            return True
        if node.node is None or not usable(run, node):
            if node.lost is None:
                return True  # not READY yet
            await self._intend(stored, Action.WATCH, inc.n)  # the watch confirms the loss
            return False
        if (why := not_ours(run, node.node, inc.n)) is not None:
            await self._give_up(stored, f"{why}; it is left alone")
            return False
        since = inc.created_at or float(run.intent.get("at") or time.time())
        earlier = {i.run_id for i in run.incarnations if i.run_id}  # a shrink's old run is still alive there
        since_then = await runs_since(self.providers, run.node, since, self.run_store)
        found = [r for r in since_then if r not in earlier]
        if found:
            run_id = found[0]  # launched before a crash, not journaled: the same run, adopted
        elif not self.lease.held:
            return True
        else:
            try:
                if run.intent.get("stop") or inc.slices is not None:  # onto other slices of the node
                    result = await elastic.relaunch_on_slices(
                        self.providers, run.id, run.node, run.job, inc.on_slices(run.slices),
                        run.intent.get("stop"), webhook_url=self.webhook_url, store=self.run_store,
                        progress=self.progress)
                else:
                    result = await relaunch.launch_again(self.providers, run.id, run.node, run.job,
                                                         self.webhook_url, self.run_store, self.progress)
            except Exception as exc:  # noqa: BLE001 - refused (UserError) or failed: a few tries
                if elastic.on_trial(run):  # a grow: back onto the slices it was on
                    return await self._grow_failed(stored, one_line(exc), None)
                return await self._launch_failed(stored, one_line(exc))
            if not result.ok:
                problem = next((s.error for s in result.starts if not s.ok), "a worker did not start")
                if elastic.on_trial(run):
                    return await self._grow_failed(stored, str(problem), result.run_id)
                return await self._launch_failed(stored, str(problem))
            run_id = result.run_id
        inc.run_id, inc.started_at = run_id, time.time()
        run.status, run.note = Status.RUNNING.value, elastic.grow_note(run)
        if run.recoveries and run.recoveries[-1].n == inc.n:
            run.recoveries[-1].started_at = inc.started_at
        await self._intend(stored, Action.WATCH, inc.n)
        self.progress(f"{run.id}: launched {run_id} on {run.node} (incarnation {inc.n})")
        return False

    async def _launch_failed(self, stored: Stored, problem: str) -> bool:
        return await self._failed(stored, Action.LAUNCH, LAUNCH_TRIES, f"launching on {stored.run.node}",
                                  "launch", problem)

    async def _failed(self, stored: Stored, action: Action, limit: int, doing: str, name: str,
                      problem: str) -> bool:
        """One more try of ACTION journaled, or the run given up after LIMIT tries."""
        run = stored.run
        tries = int(run.intent.get("tries", 0)) + 1
        if tries >= limit:
            await self._give_up(stored, f"{doing} failed {tries} times: {problem}")
            return False
        run.note = f"{name} failed ({tries} of {limit}): {problem}"
        kept = {k: v for k, v in run.intent.items() if k not in ("action", "n", "at", "by", "tries")}
        await self._intend(stored, action, run.current.n, tries=tries, **kept)  # `stop` kept, for one
        return True

    async def _cancel(self, stored: Stored) -> None:
        """A managed run cancelled (`controller cancel`): its live run stopped, its status STOPPED, and
        whatever the controller made for it swept."""
        run = stored.run
        inc = run.current if run.incarnations else None
        if inc is not None and inc.run_id and not run.state.terminal:
            with contextlib.suppress(Exception):
                await stop(self.providers, inc.run_id)
        if inc is not None and inc.ended is None:
            inc.ended, inc.ended_at = "stopped", time.time()
        run.status, run.note = Status.STOPPED.value, "cancelled"
        run.sweep_until = time.time() + self.sweep_s
        await self._intend(stored, Action.SWEEP, len(run.incarnations))
