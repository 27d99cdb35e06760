"""Creating a node through a queued resource: the request waits for capacity instead of failing.

One zone at a time (only a failure for lack of capacity or of a reservation moves on), or `race`: one
request per zone at once, the first to become ACTIVE wins and every other request is deleted, its
deletion confirmed. Each zone's state changes are reported as a timeline ("us-east5-b: ACTIVE after
4m10s"). Interrupted (Ctrl-C, esc, or SIGTERM/SIGHUP, which the CLI turns into a cancel), it raises
`CreateInterrupted` naming the requests still out, so the caller asks whether to cancel them (after a
signal it cancels without asking): none is left behind silently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Protocol

from tpu_console.domain import CreateRequest, Node, NodeState, QueueState
from tpu_console.errors import CreateInterrupted, UserError
from tpu_console.providers import capacity
from tpu_console.providers.base import Progress
from tpu_console.providers.gcp import multislice
from tpu_console.providers.gcp.capacity_record import CapacityRecord, capacity_outcome
from tpu_console.providers.gcp.client import CLOUD_PLATFORM_SCOPE
from tpu_console.providers.gcp.errors import (
    API_ERRORS,
    ApiFailure,
    FailureKind,
    classify_exception,
    classify_operation_error,
    stop_unless_next_zone,
)
from tpu_console.providers.gcp.node_mapping import node_path, state_hint
from tpu_console.providers.gcp.queued_mapping import build_queued_resource, queued_path, queued_reason

# Node states a queued node can end in without ever becoming READY.
_DEAD = (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.STOPPED, NodeState.DELETING, NodeState.HIDDEN)


class QueueHost(Protocol):
    """What a queued create uses of the provider (GcpProvider): its clients, its timings, its record."""

    project: str
    poll_interval: float
    create_timeout: float

    async def _client(self): ...
    async def _alpha(self): ...
    def _model(self, api_node, maintenance=None) -> Node: ...
    async def delete_request(self, path: str, zone: str, progress: Progress) -> None: ...
    capacity: CapacityRecord


async def try_every(calls: Iterable[Awaitable[None]]) -> None:
    """Run the calls together to their ends, each whatever the others do; then raise the first problem.
    (Deleting requests: one that fails must not leave the rest behind.)"""
    answers = await asyncio.gather(*calls, return_exceptions=True)
    problem = next((a for a in answers if isinstance(a, BaseException)), None)
    if problem is not None:
        raise problem


@dataclass
class _Race:
    winner: str | None = None


class LostRace(Exception):
    """This zone became ACTIVE after another zone had won."""


class SliceLost(UserError):
    """A slice of a multislice being created died: the others are no use without it."""


class QueuedCreate:
    """One `create` through queued resources, for `GcpProvider.create`."""

    def __init__(self, provider: QueueHost, request: CreateRequest, accelerator_type: str, runtime: str,
                 progress: Progress) -> None:
        self.provider = provider
        self.request = request
        self.accelerator_type = accelerator_type
        self.runtime = runtime
        self.progress = progress
        self.outstanding: dict[str, str] = {}  # request path -> zone: made, and not yet deleted or READY
        self.with_node: set[str] = set()  # requests that became ACTIVE: their node exists

    @property
    def project(self) -> str:
        return self.provider.project

    def _describe(self) -> str:
        waits = f", valid for {format_duration(self.request.valid_for_s)}" if self.request.valid_for_s else ""
        reservation = f" {self.request.reservation}" if self.request.reservation else ""
        return f"{self.group_type} ({self.request.provisioning}{reservation}, {self.runtime}{waits})"

    @property
    def group_type(self) -> str:
        """`v6e-16`, or `2x v6e-16` for a multislice (so the capacity record keeps groups apart)."""
        slices = self.request.slices
        return f"{slices}x {self.accelerator_type}" if slices > 1 else self.accelerator_type

    @property
    def slice_names(self) -> tuple[str, ...]:
        """The nodes the request makes: its own name, or NAME-0 .. NAME-<N-1> (the API's naming)."""
        name, slices = self.request.name, self.request.slices
        return tuple(f"{name}-{i}" for i in range(slices)) if slices > 1 else (name,)

    async def run(self, zones: list[str]) -> Node:
        try:
            if self.request.race and len(zones) > 1:
                return await self._race(zones)
            return await self._in_order(zones)
        except Exception:
            await self._abandon()
            raise
        except asyncio.CancelledError:
            if not self.outstanding:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # the caller goes on to ask and to clean up; this cancel is handled
            raise CreateInterrupted(
                "gcp", [f"{zone}/{path.rsplit('/', 1)[-1]}" for path, zone in self.outstanding.items()]
            ) from None

    async def _abandon(self) -> None:
        """The create failed: delete the requests still out, so none is left behind silently; one whose
        node exists is left for the person to look at, and named."""
        for path, zone in list(self.outstanding.items()):
            name = path.rsplit("/", 1)[-1]
            if path in self.with_node:
                self.progress(f"{zone}: left queued request {name} and its node for you to look at; "
                              f"`tpu-console delete {name} --yes` removes both")
                continue
            try:
                await self.provider.delete_request(path, zone, self.progress)
            except (UserError, *API_ERRORS) as exc:
                self.progress(f"{zone}: could not delete queued request {name} ({exc}); "
                              f"`tpu-console delete {name} --yes` removes it")
                continue
            self.outstanding.pop(path, None)
            self.provider.capacity.finish(path, capacity.FAILED, "the create failed elsewhere")

    # ---- zone after zone --------------------------------------------------------------------------

    async def _in_order(self, zones: list[str]) -> Node:
        tried: list[str] = []
        for index, zone in enumerate(zones):
            more = index + 1 < len(zones)
            outcome = await self._one_zone(zone, None)
            if isinstance(outcome, Node):
                return outcome
            stop_unless_next_zone(outcome, self.request.name, zone)
            tried.append(f"{zone} {outcome.kind}")
            self.progress(f"{zone}: {outcome.kind}" + (", trying next zone" if more else ""))
        raise UserError(f"could not create {self.request.name} ({self.group_type}, "
                        f"{self.request.provisioning}) in any zone: {'; '.join(tried)}; try other zones "
                        "(--zones), a longer --wait-for, or --race")

    # ---- every zone at once -----------------------------------------------------------------------

    async def _race(self, zones: list[str]) -> Node:
        race = _Race()
        tasks = {zone: asyncio.create_task(self._one_zone(zone, race), name=f"queue {zone}")
                 for zone in zones}

        losers_deleted: asyncio.Task[None] | None = None

        def cancel_others(winner: str) -> None:
            # The losers' requests go as soon as one zone is ACTIVE, not once its node is READY: a loser
            # that provisions meanwhile would bill and hold quota.
            nonlocal losers_deleted
            losing = [task for zone, task in tasks.items() if zone != winner]
            for task in losing:
                task.cancel()
            losers_deleted = asyncio.get_running_loop().create_task(self._delete_losers(winner, losing))

        self._on_win = cancel_others
        failures: list[str] = []
        try:
            pending = set(tasks.values())
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    zone = next(z for z, t in tasks.items() if t is task)
                    if task.cancelled():
                        continue
                    error = task.exception()
                    if isinstance(error, LostRace):
                        continue
                    if error is not None:
                        if zone == race.winner:
                            raise error
                        why = classify_exception(error).describe() if isinstance(error, API_ERRORS) else error
                        failures.append(f"{zone} {why}")
                        self.progress(f"{zone}: {why}, out of the race")
                        continue
                    outcome = task.result()
                    if isinstance(outcome, Node):
                        return outcome
                    failures.append(f"{zone} {outcome.kind}")
                    self.progress(f"{zone}: {outcome.kind}, out of the race")
            raise UserError(f"could not create {self.request.name} ({self.group_type}) in any zone: "
                            f"{'; '.join(failures)}; try other zones (--zones) or a longer --wait-for")
        except asyncio.CancelledError:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            raise
        finally:
            if race.winner is not None:
                for task in tasks.values():
                    task.cancel()
                await asyncio.gather(*tasks.values(), return_exceptions=True)
                await (losers_deleted or self._delete_losers(race.winner, []))

    async def _delete_losers(self, winner: str, losing: list[asyncio.Task]) -> None:
        """Delete every other zone's request at once, each confirmed gone; all are tried, the first
        problem is raised after."""
        await asyncio.gather(*losing, return_exceptions=True)  # their calls under way end first

        async def delete(path: str, zone: str) -> None:
            self.progress(f"{zone}: lost the race to {winner}; deleting its request")
            await self.provider.delete_request(path, zone, self.progress)
            self.outstanding.pop(path, None)
            self.provider.capacity.finish(path, capacity.LOST_RACE, f"{winner} won")

        losers = [(path, zone) for path, zone in list(self.outstanding.items()) if zone != winner]
        await try_every(delete(p, z) for p, z in losers)

    # ---- one zone ---------------------------------------------------------------------------------

    async def _one_zone(self, zone: str, race: _Race | None) -> Node | ApiFailure:
        """Queue the request in `zone` and follow it to a READY node; a failure is returned (the request
        deleted, since a FAILED one holds quota), a stop is raised."""
        provider = self.provider
        path = queued_path(self.project, zone, self.request.name)
        self.progress(f"{zone}: queuing {self._describe()}")
        provider.capacity.start(path, zone, self.group_type, self.request, "queued")
        started = time.monotonic()
        self.outstanding[path] = zone  # from the call on: interrupted mid-call, it may exist
        try:
            refused = await self._submit(zone)
        except API_ERRORS as exc:
            refused = classify_exception(exc)
        if refused is not None:
            self.outstanding.pop(path, None)
            provider.capacity.finish(path, capacity_outcome(refused), refused.message)
            return refused
        api = await provider._client()
        last: QueueState | None = None
        while True:
            try:
                api_queued = await api.get_queued_resource(path)
            except API_ERRORS as exc:
                failure = classify_exception(exc)
                if failure.kind is FailureKind.NOT_FOUND:
                    self.outstanding.pop(path, None)
                    gone = ApiFailure(FailureKind.OTHER, "NOT_FOUND", "the request was deleted elsewhere")
                    provider.capacity.finish(path, capacity.FAILED, gone.message)
                    return gone
                if failure.kind is FailureKind.TRANSIENT:
                    await asyncio.sleep(provider.poll_interval)
                    continue
                raise
            state = QueueState(api_queued.state.state.name)
            if state != last:
                last = state
                reason = queued_reason(api_queued)
                self.progress(f"{zone}: {state}{f' ({reason})' if reason else ''} after "
                              f"{format_duration(time.monotonic() - started)}")
            if state is QueueState.ACTIVE:
                active_after = time.monotonic() - started
                provider.capacity.active(path, active_after)
                if race is not None:
                    if race.winner is None:
                        race.winner = zone
                        self._on_win(zone)
                    elif race.winner != zone:
                        raise LostRace(zone)
                self.with_node.add(path)
                try:
                    node = await self._await_node(zone, started)
                except SliceLost as lost:
                    # The slices run as one program: the rest are no use, and every one bills.
                    self.progress(f"{zone}: deleting the request and all {self.request.slices} slices")
                    await provider.delete_request(path, zone, self.progress)
                    self.outstanding.pop(path, None)
                    provider.capacity.finish(path, capacity.FAILED, str(lost))
                    raise UserError(f"{lost}; its request and every slice were deleted, nothing is left: "
                                    "create it again") from None
                self.outstanding.pop(path, None)
                provider.capacity.finish(path, capacity.READY, None, active_after_s=active_after,
                                         ready_after_s=time.monotonic() - started)
                return node
            if state in (QueueState.FAILED, QueueState.SUSPENDED):
                failure = _queued_failure(api_queued, state)
                self.progress(f"{zone}: deleting the {state} request (it holds quota until deleted)")
                await provider.delete_request(path, zone, self.progress)
                self.outstanding.pop(path, None)
                provider.capacity.finish(path, capacity_outcome(failure), failure.message)
                return failure
            await asyncio.sleep(provider.poll_interval)

    async def _submit(self, zone: str) -> ApiFailure | None:
        """Create the request and wait for the create to be done (the request exists); why it was
        refused, or None."""
        provider = self.provider
        api = await provider._client()
        parent = f"projects/{self.project}/locations/{zone}"
        if self.request.best_effort:
            from google.cloud import tpu_v2alpha1 as alpha_types

            queued = build_queued_resource(alpha_types, self.request, self.project, zone,
                                           self._node_spec(alpha_types))
            operation_name = await (await provider._alpha()).create_queued_resource(
                parent, self.request.name, queued)
        else:
            from google.cloud import tpu_v2

            queued = build_queued_resource(tpu_v2, self.request, self.project, zone, self._node_spec(tpu_v2))
            operation_name = await api.create_queued_resource(parent, self.request.name, queued)
        operation = await api.wait_operation(operation_name, provider.create_timeout)
        if operation.error.code:
            return classify_operation_error(operation.error.code, operation.error.message)
        return None

    def _node_spec(self, types):
        # No scheduling_config: the request's tier (spot, reservation ...) decides, not the node.
        return types.Node(
            accelerator_type=self.accelerator_type,
            runtime_version=self.runtime,
            network_config=types.NetworkConfig(enable_external_ips=True),
            # The VM's own credentials (the metadata server's token) let the run's supervisor delete it.
            service_account=types.ServiceAccount(scope=[CLOUD_PLATFORM_SCOPE]),
            labels={**self.provider.console_marks(), **self.request.labels},
        )

    async def _await_node(self, zone: str, started: float) -> Node:
        """The request is ACTIVE: follow its node (or every slice) to READY (a node may take a moment to
        appear). A multislice is READY when every slice is; one slice dead is SliceLost."""
        provider = self.provider
        names = self.slice_names
        last: tuple | None = None
        active_at = time.monotonic()
        while True:
            found = await self._read_nodes(zone, names)
            node: Node | None = None
            if len(names) == 1:
                node = found.get(names[0])
            elif len(found) == len(names):
                node = multislice.merge(self.request.name, names, found)
            if node is not None and (node.state, node.slice_states) != last:
                last = (node.state, node.slice_states)
                elapsed = format_duration(time.monotonic() - started)
                slices = f" (slices {', '.join(node.slice_states)})" if node.slice_states else ""
                self.progress(f"{zone}: node {node.state}{slices} after {elapsed}")
            if node is not None and node.state is NodeState.READY:
                return node
            if node is not None and node.state in _DEAD:
                if node.slices > 1:
                    raise SliceLost(f"{node.name} in {zone}: {multislice.slice_problem(node)} while being "
                                    f"created{f' ({node.state_reason})' if node.state_reason else ''}")
                hint = state_hint(node) or f"delete it with `tpu-console delete {node.name} --yes`"
                raise UserError(f"{node.name} in {zone} became {node.state} while being created; {hint}")
            if time.monotonic() - active_at > provider.create_timeout:
                state = last[0] if last else f"not visible ({len(found)} of {len(names)} nodes)"
                raise UserError(f"{self.request.name} in {zone}: the request is ACTIVE but its node is still "
                                f"{state} after {format_duration(provider.create_timeout)}; "
                                "watch it with `tpu-console ls`")
            await asyncio.sleep(provider.poll_interval)

    async def _read_nodes(self, zone: str, names: tuple[str, ...]) -> dict[str, Node]:
        """The nodes of `names` that exist now, by name (at once: a multislice has one per slice)."""
        provider = self.provider
        api = await provider._client()
        answers = await asyncio.gather(*(api.get_node(node_path(self.project, zone, n)) for n in names),
                                       return_exceptions=True)
        found = {}
        for name, answer in zip(names, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, API_ERRORS):
                    raise answer
                if classify_exception(answer).kind not in (FailureKind.NOT_FOUND, FailureKind.TRANSIENT):
                    raise answer
                continue
            found[name] = provider._model(answer)
        return found


def _queued_failure(api_queued, state: QueueState) -> ApiFailure:
    if state is QueueState.FAILED:
        error = api_queued.state.failed_data.error
        return classify_operation_error(error.code, error.message or "the request failed")
    return ApiFailure(FailureKind.OTHER, "ABORTED", queued_reason(api_queued) or "the request was suspended")


def format_duration(seconds: float | None) -> str:
    seconds = round(seconds or 0)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
