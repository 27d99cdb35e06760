"""The reconcile loop's actions on the run's node itself (loop.py takes them from its journal): delete
what is left of a lost node, create the next incarnation's node, and sweep after the end.

- delete (incarnation n): delete the node if it is this run's (labels) and still lost, and its queued
  requests; done once the node reads absent. A node that reads usable again is a stale journal: watch.
- create (incarnation n): adopt a node already labelled with incarnation n (READY; wait while it is being
  made or its queued request waits), else create it: its zone first, then the configured zones ordered by
  the capacity record, one at a time (a queued request in one zone at a time: never two out at once).
- sweep (after a give-up or a cancel, for `sweep_s`; once after a success): delete the nodes the
  controller made for the run and its queued requests, and what is left of a lost node.

Nothing is deleted on a read that failed or timed out, a node is touched only when it is this run's
(judge.not_ours), and a delete or a create is begun only while the lease is held.

`NodeActions` is mixed into the Controller, whose journal (`_intend`, `_save`, `_give_up`), node reads
(`_read_node`, `_provider`), lease and options these use.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from tpu_console.controller import state as st
from tpu_console.controller.judge import not_ours
from tpu_console.controller.lease import Lease
from tpu_console.controller.observe import LOST_STATES, NodeReading, read_requests
from tpu_console.controller.state import Action, Incarnation, Status, Stored
from tpu_console.domain import CreateRequest, NodeState
from tpu_console.errors import NotFound, one_line
from tpu_console.providers import capacity
from tpu_console.providers.base import Progress, Provider
from tpu_console.providers.nodes import create_node

DOCTOR = "the pod doctor"  # a recovery's reason when the doctor found the new node unfit


class NodeActions:
    """delete, create and sweep, as the Controller's methods; what they use of it:"""

    providers: dict[str, Provider]
    lease: Lease
    read_timeout_s: float
    progress: Progress
    id: str
    _save: Callable[[Stored], Awaitable[None]]
    _intend: Callable[..., Awaitable[None]]
    _give_up: Callable[[Stored, str], Awaitable[None]]
    _provider: Callable[[Stored], Provider]
    _read_node: Callable[[Stored], Awaitable[NodeReading]]

    async def _delete(self, stored: Stored) -> bool:
        run = stored.run
        provider = self._provider(stored)
        node = await self._read_node(stored)
        if not node.known:
            return True
        recovery = run.recoveries[-1] if run.recoveries else None
        if node.node is not None:
            if (why := not_ours(run, node.node, len(run.incarnations))) is not None:
                await self._give_up(stored, f"{why}; it is left alone")
                return False
            lost = node.node.state in (*LOST_STATES, NodeState.DELETING)
            # the two losses of a node that reads READY: its hosts unreachable, or the doctor's finding
            host_lost = recovery is not None and (recovery.reason == "host lost"
                                                  or recovery.reason.startswith(DOCTOR))
            if not lost and not host_lost and node.node.state is not NodeState.CREATING:
                # the loss was confirmed, yet the node reads usable: a stale journal; look again instead
                run.status = Status.RUNNING.value
                if recovery is not None and recovery.n == len(run.incarnations):
                    run.recoveries.pop()
                await self._intend(stored, Action.WATCH, run.current.n)
                return False
            if node.node.state is not NodeState.DELETING:
                if not self.lease.held:
                    return True  # lost the lease while reading: the one holding it acts now
                try:
                    await provider.delete(run.node, progress=self.progress)
                except NotFound:
                    pass
                except Exception as exc:  # noqa: BLE001 - tried again next pass
                    run.note = f"delete failed: {one_line(exc)}"
                    await self._save(stored)
                    return True
        await self._delete_requests(stored, keep_zone=None)
        again = await self._read_node(stored)
        if not again.absent:
            return True
        if recovery is not None and recovery.deleted_at is None:
            recovery.deleted_at = time.time()
        if run.state.terminal:
            await self._intend(stored, Action.SWEEP, len(run.incarnations))
        else:
            await self._intend(stored, Action.CREATE, len(run.incarnations))
        return False

    async def _delete_requests(self, stored: Stored, keep_zone: str | None) -> bool:
        """Delete the queued requests of this run (its labels) but the one in `keep_zone`; False when they
        could not be listed."""
        run = stored.run
        provider = self._provider(stored)
        requests = await read_requests(provider, run.node, self.read_timeout_s)
        if requests is None:
            return False
        for request in requests:
            if request.labels.get(st.MANAGED_LABEL) != run.id or request.zone == keep_zone:
                continue
            if request.labels.get(st.INCARNATION_LABEL, "0").isdigit() and int(
                    request.labels.get(st.INCARNATION_LABEL, "0")) > len(run.incarnations):
                continue  # a newer incarnation's, made by a controller that knows more than this record
            with contextlib.suppress(NotFound):
                await provider.delete_queued(request, self.progress)
        return True

    def _zones(self, stored: Stored) -> tuple[str, ...]:
        """Its last zone first, then the configured zones as the capacity record orders them."""
        run = stored.run
        last = next((i.zone for i in reversed(run.incarnations) if i.zone), None)
        configured = [z for z in run.zones if z]
        try:
            records = capacity.summarize(capacity.CapacityStore().attempts(run.accelerator_type),
                                         datetime.now(UTC))
            ordered = [z for z in capacity.order_zones(configured, records, run.accelerator_type)
                       if z in configured]
        except Exception:  # noqa: BLE001 - no record to read: the configured order
            ordered = configured
        return tuple(dict.fromkeys(z for z in (last, *ordered) if z and z != "local"))

    async def _create(self, stored: Stored) -> bool:
        run = stored.run
        n = len(run.incarnations)
        if run.deadline is not None and time.time() >= run.deadline:
            await self._give_up(stored, "its deadline passed while its node was being made again")
            return False
        provider = self._provider(stored)
        node = await self._read_node(stored)
        if not node.known:
            return True
        if node.node is not None:
            labels = node.node.labels
            if labels.get(st.MANAGED_LABEL) == run.id and labels.get(st.INCARNATION_LABEL) == str(n):
                if node.node.state is NodeState.READY:
                    return await self._created(stored, node.node.zone)
                if node.node.state in LOST_STATES:
                    await self._intend(stored, Action.DELETE, n)  # lost before it was used
                    return False
                return True  # being made
            if (why := not_ours(run, node.node, n)) is not None:
                await self._give_up(stored, f"{why}; its name is taken")
                return False
            await self._intend(stored, Action.DELETE, n)  # an older incarnation's, still there
            return False
        requests = await read_requests(provider, run.node, self.read_timeout_s)
        if requests is None:
            return True
        for request in requests:
            if request.labels.get(st.MANAGED_LABEL) != run.id:
                await self._give_up(stored, f"a queued request {request.name} in {request.zone} is not this "
                                    "run's; it is left alone")
                return False
            if request.labels.get(st.INCARNATION_LABEL) == str(n) and request.state.waiting:
                run.note = f"waiting for the queued request in {request.zone} ({request.state})"
                await self._save(stored)
                return True  # made before a crash: it fills, or fails, and is looked at again
            with contextlib.suppress(NotFound):
                await provider.delete_queued(request, self.progress)
        zones = self._zones(stored)
        request = CreateRequest(
            name=run.node, accelerator_type=run.accelerator_type, zones=zones, spot=run.spot,
            runtime_version=run.runtime_version, labels=run.labels, queued=run.queued,
            # one zone at a time, never raced: a race has a request out in every zone, and two of them can
            # fill at once, which would make two live nodes of one run
            race=False, valid_for_s=run.valid_for_s, slices=run.slices)
        self.progress(f"{run.id}: creating {run.node} (incarnation {n}) in {', '.join(zones) or 'local'}")
        if not self.lease.held:
            return True
        try:
            made = await create_node(self.providers, run.provider, request, progress=self.progress)
        except Exception as exc:  # noqa: BLE001 - no capacity anywhere, an API failure: tried next pass
            run.note = f"create failed: {one_line(exc)}"
            await self._save(stored)
            return True
        return await self._created(stored, made.zone)

    async def _created(self, stored: Stored, zone: str | None) -> bool:
        run = stored.run
        now = time.time()
        run.incarnations.append(Incarnation(len(run.incarnations), run.node, zone, created_at=now))
        if run.recoveries and run.recoveries[-1].n == run.current.n:
            run.recoveries[-1].created_at, run.recoveries[-1].zone = now, zone
        run.note = None
        await self._intend(stored, Action.PREPARE, run.current.n)
        return False

    async def _sweep(self, stored: Stored) -> bool:
        """After a give-up or a cancel: delete what is the run's and holds no live run, until sweep_until."""
        run = stored.run
        provider = self._provider(stored)
        node = await self._read_node(stored)
        # a node of a newer incarnation than this run ever made is not its to sweep (a stale record)
        if node.node is not None and not_ours(run, node.node, len(run.incarnations)) is None:
            labelled = node.node.labels.get(st.MANAGED_LABEL) == run.id
            # the controller's own nodes go; the first one, made by hand, only once it is lost
            if labelled or node.node.state in LOST_STATES:
                with contextlib.suppress(NotFound):
                    try:
                        await provider.delete(run.node, progress=self.progress)
                    except Exception as exc:  # noqa: BLE001 - tried again next pass
                        run.note = f"{run.note}; sweep: delete failed: {one_line(exc)}"
                        await self._save(stored)
                        return True
                if run.incarnations and run.current.ended is None:
                    run.current.ended, run.current.ended_at = "swept", time.time()
        await self._delete_requests(stored, keep_zone=None)
        run.heartbeat = {"at": time.time(), "by": self.id}
        if run.sweep_until is None or time.time() >= run.sweep_until:
            run.intent = None  # swept for as long as a late request could still fill
        await self._save(stored)
        return True
