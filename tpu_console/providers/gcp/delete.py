"""Deleting on the TPU API: a node (through its queued request, when it has one), a multislice (every slice
goes with its request), or a queued request with or without a node; each waited for until it is confirmed
gone, so quota is known to be free when the command returns."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from tpu_console.domain import Node, QueuedRequest
from tpu_console.errors import NotFound, UserError
from tpu_console.providers import capacity
from tpu_console.providers.base import Progress, no_progress
from tpu_console.providers.gcp import multislice
from tpu_console.providers.gcp.capacity_record import CapacityRecord
from tpu_console.providers.gcp.errors import (
    API_ERRORS,
    FailureKind,
    classify_exception,
    classify_operation_error,
)
from tpu_console.providers.gcp.node_mapping import node_path
from tpu_console.providers.gcp.queued import format_duration, try_every
from tpu_console.providers.gcp.queued_mapping import queued_path, split_queued_path, to_queued_request


class DeleteHost(Protocol):
    """What deleting uses of the provider (GcpProvider): its client, its lookups, its timings, its record."""

    project: str
    poll_interval: float
    delete_timeout: float
    capacity: CapacityRecord

    async def _client(self): ...
    def _model(self, api_node, maintenance=None) -> Node: ...
    def _zones(self, zones: tuple[str, ...] | list[str] = ()) -> list[str]: ...
    async def _find(self, name: str): ...
    async def _find_multislice(self, name: str) -> tuple[Node, list] | None: ...


class Deletion:
    """The provider's deletes, for `GcpProvider.delete`, `delete_queued` and `cancel_requests`."""

    def __init__(self, provider: DeleteHost) -> None:
        self.provider = provider

    @property
    def project(self) -> str:
        return self.provider.project

    async def delete(self, name: str, progress: Progress = no_progress) -> None:
        """Delete the node (through its queued request, when it has one) and wait until it is gone; or a
        queued request without a node. The caller has already asked for confirmation."""
        provider = self.provider
        api = await provider._client()
        try:
            node = provider._model(await provider._find(name))
        except NotFound:
            group = await provider._find_multislice(name)
            if group is not None:
                await self._delete_multislice(group[0], progress)
                return
            request = await self.find_request(name)
            if request is None:
                raise
            await self.delete_queued(request, progress)
            return
        if node.queued_request:
            if node.state.holds_quota:
                progress(f"{name} is {node.state}: it holds TPU quota until deleted, deleting it frees that")
            progress(f"{node.zone}: deleting {name} with its queued request {node.queued_request}")
            await self.delete_request(queued_path(self.project, node.zone or "-", node.queued_request),
                                      node.zone or "-", progress)
            provider.capacity.ended(node)
            return
        if node.state.holds_quota:
            progress(f"{name} is {node.state}: it holds TPU quota until deleted, deleting it frees that")
        progress(f"{node.zone}: deleting {name} ({node.accelerator_type}, {node.state})")
        path = node_path(self.project, node.zone or "-", name)
        started = time.monotonic()
        try:
            operation_name = await api.delete_node(path)
        except API_ERRORS as exc:
            failure = classify_exception(exc)
            fix = f"; {failure.fix()}" if failure.fix() else ""
            raise UserError(f"delete {name} in {node.zone}: {failure.describe()}{fix}") from None
        try:
            operation = await api.wait_operation(operation_name, provider.delete_timeout)
        except TimeoutError:
            raise UserError(
                f"{name} is still being deleted after {format_duration(provider.delete_timeout)}; "
                "check `tpu-console ls` later"
            ) from None
        if operation.error.code:
            failure = classify_operation_error(operation.error.code, operation.error.message)
            raise UserError(f"delete {name} in {node.zone} failed: {failure.describe()}")
        progress(f"{node.zone}: {name} deleted after {format_duration(time.monotonic() - started)}")
        provider.capacity.ended(node)

    async def _delete_multislice(self, group: Node, progress: Progress) -> None:
        """Every slice goes with the request (`force`), confirmed gone."""
        zone = group.zone or "-"
        if group.state.holds_quota:
            progress(f"{group.name}: {multislice.slice_problem(group)}; its slices hold TPU quota until "
                     "deleted, deleting them frees that")
        progress(f"{zone}: deleting {group.name}, {group.slices} slices ({', '.join(group.slice_names)}), "
                 f"with its queued request {group.queued_request or group.name}")
        await self.delete_request(queued_path(self.project, zone, group.queued_request or group.name), zone,
                                  progress)
        self.provider.capacity.ended(group)

    # ---- queued requests --------------------------------------------------------------------------

    async def find_request(self, name: str) -> QueuedRequest | None:
        """The queued request called `name` in the configured zones (every zone without any)."""
        api = await self.provider._client()
        zones = self.provider._zones() or ["-"]
        answers = await asyncio.gather(
            *(api.list_queued_resources(f"projects/{self.project}/locations/{zone}") for zone in zones),
            return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                continue
            for api_queued in answer:
                if split_queued_path(api_queued.name)[2] == name:
                    return to_queued_request(api_queued)
        return None

    async def delete_request(self, path: str, zone: str, progress: Progress = no_progress) -> None:
        """Delete a queued request (with its node, if it has one) and confirm it is gone."""
        provider = self.provider
        api = await provider._client()
        name = path.rsplit("/", 1)[-1]
        started = time.monotonic()
        try:
            await api.delete_queued_resource(path, force=True)
        except API_ERRORS as exc:
            failure = classify_exception(exc)
            if failure.kind is not FailureKind.NOT_FOUND:
                raise UserError(f"could not delete queued request {name} in {zone}: {failure.describe()}; "
                                f"delete it with `tpu-console delete {name} --yes`") from None
        while True:
            try:
                await api.get_queued_resource(path)
            except API_ERRORS as exc:
                if classify_exception(exc).kind is FailureKind.NOT_FOUND:
                    break
                raise
            if time.monotonic() - started > provider.delete_timeout:
                raise UserError(f"queued request {name} in {zone} is still there after "
                                f"{format_duration(provider.delete_timeout)}; check `tpu-console ls` later")
            await asyncio.sleep(provider.poll_interval)
        progress(f"{zone}: queued request {name} deleted, confirmed gone after "
                 f"{format_duration(time.monotonic() - started)}")

    async def delete_queued(self, request: QueuedRequest, progress: Progress = no_progress) -> None:
        zone = request.zone or "-"
        if request.state.holds_quota:
            progress(f"queued request {request.name} is {request.state}: it holds quota until deleted")
        await self.delete_request(queued_path(self.project, zone, request.name), zone, progress)

    async def cancel_requests(self, requests: list[str], progress: Progress = no_progress) -> None:
        """Delete each request (`zone/name`) and confirm it is gone; every one is tried, and the first
        problem is raised after."""
        async def cancel(item: str) -> None:
            zone, _, name = item.partition("/")
            path = queued_path(self.project, zone, name)
            await self.delete_request(path, zone, progress)
            self.provider.capacity.finish(path, capacity.CANCELLED, "cancelled while waiting")

        await try_every(cancel(item) for item in requests)
