"""Creating a node with the Create Node API (no queue): the request is refused at once when a zone has no
capacity, so the zones are tried in order and only a stockout or a missing reservation moves on to the next.
Each accepted create is followed to READY, its state changes reported as a timeline ("us-east5-b: CREATING
after 40s"); a create that fails leaves no node behind.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from tpu_console.domain import CreateRequest, Node, NodeState
from tpu_console.errors import UserError
from tpu_console.providers import capacity
from tpu_console.providers.base import Progress
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
from tpu_console.providers.gcp.queued import format_duration

# States a node being created can end in without ever becoming READY.
_DEAD_STATES = (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.STOPPED, NodeState.DELETING,
                NodeState.HIDDEN, NodeState.UNKNOWN)


class CreateHost(Protocol):
    """What a direct create uses of the provider (GcpProvider): its client, its timings, its record."""

    project: str
    poll_interval: float
    create_timeout: float
    delete_timeout: float
    capacity: CapacityRecord

    async def _client(self): ...
    def _model(self, api_node, maintenance=None) -> Node: ...
    def console_marks(self) -> dict[str, str]: ...


class DirectCreate:
    """One `create` with the Create Node API, for `GcpProvider.create`."""

    def __init__(self, provider: CreateHost, request: CreateRequest, accelerator_type: str, runtime: str,
                 progress: Progress) -> None:
        self.provider = provider
        self.request = request
        self.accelerator_type = accelerator_type
        self.runtime = runtime
        self.progress = progress

    async def run(self, zones: list[str]) -> Node:
        from google.cloud import tpu_v2

        provider, request, progress = self.provider, self.request, self.progress
        accelerator_type, runtime = self.accelerator_type, self.runtime
        api = await provider._client()
        kind = "spot" if request.spot else "on-demand"
        spec = tpu_v2.Node(
            accelerator_type=accelerator_type,
            runtime_version=runtime,
            scheduling_config=tpu_v2.SchedulingConfig(spot=request.spot),
            network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
            # The VM's own credentials (the metadata server's token) let the run's supervisor delete it.
            service_account=tpu_v2.ServiceAccount(scope=[CLOUD_PLATFORM_SCOPE]),
            labels={**provider.console_marks(), **request.labels},
        )

        tried: list[str] = []
        for index, zone in enumerate(zones):
            more = index + 1 < len(zones)
            progress(f"{zone}: creating {accelerator_type} ({kind}, {runtime})")
            path = node_path(provider.project, zone, request.name)
            provider.capacity.start(path, zone, accelerator_type, request, "direct")
            started = time.monotonic()
            try:
                operation_name = await api.create_node(
                    f"projects/{provider.project}/locations/{zone}", request.name, spec
                )
            except API_ERRORS as exc:
                failure = classify_exception(exc)
                provider.capacity.finish(path, capacity_outcome(failure), failure.message)
                stop_unless_next_zone(failure, request.name, zone)
                tried.append(f"{zone} {failure.kind}")
                progress(f"{zone}: {failure.kind}" + (", trying next zone" if more else ""))
                continue
            progress(f"{zone}: accepted, waiting for READY")
            try:
                outcome = await self._await_ready(zone, operation_name)
            except (UserError, asyncio.CancelledError) as exc:
                cancelled = isinstance(exc, asyncio.CancelledError)
                outcome_now = capacity.CANCELLED if cancelled else capacity.FAILED
                provider.capacity.finish(path, outcome_now, str(exc) or None)
                raise
            if isinstance(outcome, Node):
                waited = time.monotonic() - started
                provider.capacity.finish(path, capacity.READY, None, active_after_s=waited,
                                         ready_after_s=waited)
                return outcome
            provider.capacity.finish(path, capacity_outcome(outcome), outcome.message)
            stop_unless_next_zone(outcome, request.name, zone)
            tried.append(f"{zone} {outcome.kind}")
            progress(f"{zone}: {outcome.kind}" + (", trying next zone" if more else ""))
        fix = (
            "try other zones (--zones), "
            + ("on-demand (--on-demand)" if request.spot else "spot (--spot)")
            + ", or retry later"
        )
        raise UserError(
            f"could not create {request.name} ({accelerator_type}, {kind}) in any zone: "
            f"{'; '.join(tried)}; {fix}"
        )

    async def _await_ready(self, zone: str, operation_name: str) -> Node | ApiFailure:
        """Follow a create until the node is READY (returns it) or the operation fails (returns why).

        Reports each state change with the time since the create was accepted: the state timeline.
        """
        provider, name, progress = self.provider, self.request.name, self.progress
        api = await provider._client()
        path = node_path(provider.project, zone, name)
        started = time.monotonic()
        last_state: NodeState | None = None
        while True:
            operation = await api.get_operation(operation_name)
            if operation.done and operation.error.code:
                failure = classify_operation_error(operation.error.code, operation.error.message)
                await self._remove_failed_node(path, zone)
                return failure
            try:
                node = provider._model(await api.get_node(path))
            except API_ERRORS as exc:
                if classify_exception(exc).kind is not FailureKind.NOT_FOUND:
                    raise
                node = None  # not visible yet
            if node is not None and node.state != last_state:
                last_state = node.state
                elapsed = format_duration(time.monotonic() - started)
                reason = f" ({node.state_reason})" if node.state_reason and node.state in _DEAD_STATES else ""
                progress(f"{zone}: {node.state}{reason} after {elapsed}")
            if node is not None and node.state is NodeState.READY:
                return node
            if node is not None and node.state in _DEAD_STATES:
                hint = state_hint(node) or f"delete it with `tpu-console delete {name} --yes`"
                raise UserError(f"{name} in {zone} became {node.state} while being created; {hint}")
            if time.monotonic() - started > provider.create_timeout:
                raise UserError(
                    f"{name} in {zone} is still {last_state or 'not visible'} after "
                    f"{format_duration(provider.create_timeout)}; watch it with `tpu-console ls`"
                )
            await asyncio.sleep(provider.poll_interval)

    async def _remove_failed_node(self, path: str, zone: str) -> None:
        """A failed create can leave the node behind in a failed state; remove it so it holds nothing."""
        api = await self.provider._client()
        try:
            await api.get_node(path)
        except API_ERRORS:
            return  # gone (the usual case) or unreadable: nothing more to do here
        self.progress(f"{zone}: removing the node the failed create left behind")
        try:
            operation_name = await api.delete_node(path)
            await api.wait_operation(operation_name, self.provider.delete_timeout)
        except API_ERRORS as exc:
            self.progress(f"{zone}: could not remove it ({classify_exception(exc).describe()}); "
                          "delete it by hand")
