"""The gcp provider: Cloud TPU VMs through the TPU v2 API.

List across the configured zones at once; create with zone fallback (only a stockout or a missing
reservation moves on to the next zone); delete and wait; SSH access with the console's key in node
metadata (or OS Login) and host keys pinned from guest attributes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import sqlite3
import time
from datetime import UTC, datetime
from typing import Any

from tpu_console import ssh_identity
from tpu_console.domain import CreateRequest, Node, NodeState, QueuedRequest, SshTarget, validate_node_name
from tpu_console.errors import AlreadyExists, NotFound, UserError
from tpu_console.providers import capacity
from tpu_console.providers.base import NodeListing, Progress, Provider, no_progress
from tpu_console.providers.gcp import accelerators, labels, multislice, ssh_access
from tpu_console.providers.gcp.alpha import AlphaApi
from tpu_console.providers.gcp.client import (
    CLOUD_PLATFORM_SCOPE,
    TpuApi,
    load_credentials,
    make_tpu_client,
    oslogin_endpoint,
    require_project,
)
from tpu_console.providers.gcp.errors import (
    API_ERRORS,
    ApiFailure,
    FailureKind,
    classify_exception,
    classify_operation_error,
)
from tpu_console.providers.gcp.node_mapping import (
    maintenance_of,
    node_path,
    split_node_path,
    state_hint,
    to_model_node,
)
from tpu_console.providers.gcp.queued import QueuedCreate, capacity_outcome, try_every
from tpu_console.providers.gcp.queued import format_duration as _format_duration
from tpu_console.providers.gcp.queued_mapping import (
    node_name_of,
    queued_path,
    slice_ids,
    split_queued_path,
    supports_queued,
    to_queued_request,
)
from tpu_console.settings import Settings

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
# States a node being created can end in without ever becoming READY.
_DEAD_STATES = (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.STOPPED, NodeState.DELETING,
                NodeState.HIDDEN, NodeState.UNKNOWN)


class GcpProvider(Provider):
    name = "gcp"

    def __init__(self, settings: Settings, *, poll_interval: float = 5.0, create_timeout: float = 1800.0,
                 delete_timeout: float = 900.0, host_key_wait: float = 120.0):
        self._settings = settings.gcp
        self.poll_interval = poll_interval
        self.create_timeout = create_timeout
        self.delete_timeout = delete_timeout
        self.host_key_wait = host_key_wait  # how long a fresh node may take to publish its host keys
        self._api: TpuApi | None = None  # built on first use, so a missing login only bites when used
        self._alpha_api: AlphaApi | None = None
        self._capacity: capacity.CapacityStore | None = None
        self._attempts: dict[str, capacity.Attempt] = {}  # request or node path -> its open attempt

    # ---- plumbing ---------------------------------------------------------------------------------

    def console_marks(self) -> dict[str, str]:
        """The labels on every node and queued request made here: who made it, for which project."""
        return labels.console_marks(project=self._settings.team_project)

    @property
    def project(self) -> str:
        return require_project(self._settings)

    async def _client(self) -> TpuApi:
        if self._api is None:
            self.project  # noqa: B018 (fail on a missing project before touching credentials)
            # In a thread: finding credentials can probe the GCE metadata server for seconds.
            client = await asyncio.to_thread(make_tpu_client, self._settings)
            if self._api is None:  # another task may have built one meanwhile
                self._api = TpuApi(client, poll_interval=self.poll_interval)
        return self._api

    async def _alpha(self) -> AlphaApi:
        if self._alpha_api is None:
            credentials = await asyncio.to_thread(load_credentials, self._settings.api_endpoint)
            self._alpha_api = AlphaApi(credentials, self._settings.api_endpoint)
        return self._alpha_api

    def _zones(self, zones: tuple[str, ...] | list[str] = ()) -> list[str]:
        return [z for z in (zones or self._settings.zones) if z]

    def _model(self, api_node, maintenance=None) -> Node:
        return to_model_node(api_node, internal_ip=self._settings.internal_ip, maintenance=maintenance)

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None
        if self._alpha_api is not None:
            await self._alpha_api.close()
            self._alpha_api = None

    # ---- the capacity record (a failure to write it never fails a create) ------------------------

    def _store(self) -> capacity.CapacityStore | None:
        if self._capacity is None:
            try:
                self._capacity = capacity.CapacityStore()
            except sqlite3.Error:
                return None
        return self._capacity

    def capacity_start(self, path: str, zone: str, accelerator_type: str, request: CreateRequest,
                       method: str) -> None:
        attempt = capacity.Attempt(
            provider=self.name, project=self.project, zone=zone, accelerator_type=accelerator_type,
            provisioning=request.provisioning, method=method, node=request.name,
            started_at=datetime.now(UTC))
        self._attempts[path] = attempt
        if (store := self._store()) is not None:
            try:
                store.start(attempt)
            except sqlite3.Error:
                pass

    def capacity_active(self, path: str, active_after_s: float) -> None:
        attempt = self._attempts.get(path)
        if attempt is not None and attempt.id and (store := self._store()) is not None:
            try:
                store.mark_active(attempt.id, active_after_s)
            except sqlite3.Error:
                pass

    def capacity_finish(self, path: str, outcome: str, reason: str | None, *,
                        active_after_s: float | None = None, ready_after_s: float | None = None) -> None:
        attempt = self._attempts.pop(path, None)
        if attempt is not None and attempt.id and (store := self._store()) is not None:
            try:
                store.finish(attempt.id, outcome, reason, active_after_s=active_after_s,
                             ready_after_s=ready_after_s)
            except sqlite3.Error:
                pass

    def _capacity_note(self, nodes: list[Node], now: datetime) -> None:
        """Spot nodes first seen PREEMPTED: when, for the preemption rate of their zone."""
        store = self._store()
        if store is None:
            return
        for node in nodes:
            if node.spot and node.state is NodeState.PREEMPTED and node.zone:
                try:
                    store.mark_preempted(self.project, node.zone, node.name, now)
                except sqlite3.Error:
                    return

    # ---- list / get -------------------------------------------------------------------------------

    async def list_nodes(self) -> NodeListing:
        """Nodes and queued requests of every zone at once; maintenance from the v2alpha1 listing (a
        zone whose alpha listing fails just shows none)."""
        api = await self._client()
        alpha = await self._alpha()
        zones = self._zones() or ["-"]  # "-": every location the project has nodes in
        parents = [f"projects/{self.project}/locations/{zone}" for zone in zones]
        answers = await asyncio.gather(*(api.list_nodes(parent) for parent in parents),
                                       *(api.list_queued_resources(parent) for parent in parents),
                                       *(alpha.list_nodes(parent) for parent in parents),
                                       return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                raise answer
        count = len(zones)
        node_answers, queued_answers = answers[:count], answers[count:2 * count]
        alpha_answers = answers[2 * count:]
        maintenance = {alpha_node.name: found for answer in alpha_answers if not isinstance(answer, Exception)
                       for alpha_node in answer if (found := maintenance_of(alpha_node)) is not None}
        listing = NodeListing()
        requests: list[tuple[QueuedRequest, str | None]] = []
        multislices: dict[tuple[str, str], tuple[str, ...]] = {}  # (zone, request) -> its slices' names
        for zone, answer, queued in zip(zones, node_answers, queued_answers, strict=True):
            where = "all zones" if zone == "-" else f"zone {zone}"
            if isinstance(answer, Exception):
                listing.problems.append(f"{where}: {classify_exception(answer).describe()}")
                continue
            listing.nodes.extend(self._model(api_node, maintenance.get(api_node.name)) for api_node in answer)
            if isinstance(queued, Exception):
                listing.problems.append(f"{where} (queued requests): {classify_exception(queued).describe()}")
                continue
            requests.extend((to_queued_request(q), node_name_of(q)) for q in queued)
            multislices.update({split_queued_path(q.name)[1:]: ids for q in queued if (ids := slice_ids(q))})
        listing.nodes = multislice.group_listed(listing.nodes, multislices)
        listing.nodes.sort(key=lambda node: (node.zone or "", node.name))
        with_node = {(node.zone, node.name) for node in listing.nodes}
        listing.requests = sorted(
            (dataclasses.replace(r, has_node=(r.zone, node_id) in with_node) for r, node_id in requests),
            key=lambda r: (r.zone or "", r.name))
        self._capacity_note(listing.nodes, datetime.now(UTC))
        return listing

    async def get(self, name: str) -> Node:
        """The node `name`, or the multislice `name` (its slices NAME-0 ... as one node)."""
        try:
            return self._model(await self._find(name))
        except NotFound:
            group = await self._find_multislice(name)
            if group is None:
                raise
            return group[0]

    async def _find_multislice(self, name: str) -> tuple[Node, list] | None:
        """The multislice made by the queued request `name` (as one node, and its slices' API nodes in
        order), or None when there is no such request or none of its slices exists yet."""
        api = await self._client()
        zones = self._zones()
        if not zones:
            listing = await self.list_nodes()
            zones = [n.zone for n in listing.nodes if n.name == name and n.slices > 1 and n.zone]
        answers = await asyncio.gather(
            *(api.get_queued_resource(queued_path(self.project, zone, name)) for zone in zones),
            return_exceptions=True)
        for zone, answer in zip(zones, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                continue  # not there (or unreadable: _find has already said what it could not ask)
            if ids := slice_ids(answer) or await self._slices_by_request(zone, answer):
                return await self._read_multislice(zone, name, ids)
        return None

    async def _slices_by_request(self, zone: str, api_queued) -> tuple[str, ...]:
        """A request with no node id whose node count v2 does not show (best-effort's v2alpha1
        `multi_node_params`): its slices are the zone's nodes that name it, in slice order."""
        specs = list(api_queued.tpu.node_spec)
        if not specs or specs[0].node_id:
            return ()
        nodes = await (await self._client()).list_nodes(f"projects/{self.project}/locations/{zone}")
        names = [split_node_path(n.name)[2] for n in nodes if n.queued_resource == api_queued.name]
        return tuple(sorted(names, key=multislice.slice_number)) if len(names) > 1 else ()

    async def _read_multislice(self, zone: str, name: str, ids: tuple[str, ...]) -> tuple[Node, list] | None:
        api = await self._client()
        answers = await asyncio.gather(*(api.get_node(node_path(self.project, zone, i)) for i in ids),
                                       return_exceptions=True)
        found = {}
        for answer in answers:
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                failure = classify_exception(answer)
                if failure.kind is not FailureKind.NOT_FOUND:
                    raise UserError(f"could not read the slices of {name}: {failure.describe()}")
                continue
            found[split_node_path(answer.name)[2]] = answer
        if not found:
            return None
        group = multislice.merge(name, ids, {i: self._model(found[i]) for i in found})
        return group, [found[i] for i in ids if i in found]

    async def _find(self, name: str):
        """The API node called `name` in the configured zones (or anywhere, with no zones configured)."""
        api = await self._client()
        zones = self._zones()
        if not zones:
            listing = await self.list_nodes()
            matches = [n for n in listing.nodes if n.name == name]
            if not matches:
                hint = f" (could not list {'; '.join(listing.problems)})" if listing.problems else ""
                raise NotFound(f"no gcp node {name!r} in project {self.project}{hint}")
            zones = [matches[0].zone or "-"]
        answers = await asyncio.gather(
            *(api.get_node(node_path(self.project, zone, name)) for zone in zones), return_exceptions=True
        )
        found, problems = [], []
        for zone, answer in zip(zones, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                failure = classify_exception(answer)
                if failure.kind is not FailureKind.NOT_FOUND:
                    problems.append(f"zone {zone}: {failure.describe()}")
                continue
            found.append((zone, answer))
        if len(found) > 1:
            raise UserError(f"gcp node {name!r} exists in zones {', '.join(z for z, _ in found)}; "
                            "pass --zones to pick one")
        if found:
            return found[0][1]
        if problems:
            raise UserError(f"gcp node {name!r} not found, and could not ask {'; '.join(problems)}")
        raise NotFound(f"no gcp node {name!r} in zones {', '.join(zones)} of project {self.project}")

    # ---- create -----------------------------------------------------------------------------------

    async def create(self, request: CreateRequest, progress: Progress = no_progress) -> Node:
        """Create `request.name`, trying `request.zones` (else the configured zones) in order."""
        from google.cloud import tpu_v2

        # Everything local first: nothing is sent before the request is known to be well-formed.
        if problem := validate_node_name(request.name):
            raise UserError(problem)
        accelerator_type = accelerators.canonical_type(request.accelerator_type)
        accelerators.shape_for(accelerator_type)
        zones = self._zones(request.zones)
        if not zones:
            raise UserError("no zone to create in: pass --zones europe-west4-a,us-east5-b or set [gcp] zones")
        if "-" in zones:
            raise UserError("zone '-' means all zones and only works for listing; name real zones in --zones")
        _validate_labels(request.labels)
        runtime = request.runtime_version or accelerators.default_runtime_version(accelerator_type)
        if request.slices > 1 and not request.queued:
            raise UserError("--slices: the TPU API makes a multislice only as a queued resource; "
                            "leave out --direct")
        # A multislice is a queued request whatever the family (v4 too): only a node count makes one.
        queued = request.queued and (supports_queued(accelerator_type) or request.slices > 1)
        needs_queue = [flag for flag, asked in (("--reservation", request.reservation),
                                                ("--best-effort", request.best_effort),
                                                ("--wait-for", request.valid_for_s), ("--race", request.race))
                       if asked]
        if needs_queue and not queued:
            why = ("drop --direct" if not request.queued else
                   f"{accelerator_type} has no queued resources (v5e, v5p and v6e do)")
            raise UserError(f"{', '.join(needs_queue)} work through a queued request: {why}")
        if queued:
            return await QueuedCreate(self, request, accelerator_type, runtime, progress).run(zones)
        if request.queued:
            progress(f"{accelerator_type} has no queued resources; creating it with the Create Node API")
        api = await self._client()
        kind = "spot" if request.spot else "on-demand"
        spec = tpu_v2.Node(
            accelerator_type=accelerator_type,
            runtime_version=runtime,
            scheduling_config=tpu_v2.SchedulingConfig(spot=request.spot),
            network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
            # The VM's own credentials (the metadata server's token) let the run's supervisor delete it.
            service_account=tpu_v2.ServiceAccount(scope=[CLOUD_PLATFORM_SCOPE]),
            labels={**self.console_marks(), **request.labels},
        )

        tried: list[str] = []
        for index, zone in enumerate(zones):
            more = index + 1 < len(zones)
            progress(f"{zone}: creating {accelerator_type} ({kind}, {runtime})")
            path = node_path(self.project, zone, request.name)
            self.capacity_start(path, zone, accelerator_type, request, "direct")
            started = time.monotonic()
            try:
                operation_name = await api.create_node(
                    f"projects/{self.project}/locations/{zone}", request.name, spec
                )
            except API_ERRORS as exc:
                failure = classify_exception(exc)
                self.capacity_finish(path, capacity_outcome(failure), failure.message)
                self._stop_unless_next_zone(failure, request.name, zone)
                tried.append(f"{zone} {failure.kind}")
                progress(f"{zone}: {failure.kind}" + (", trying next zone" if more else ""))
                continue
            progress(f"{zone}: accepted, waiting for READY")
            try:
                outcome = await self._await_ready(request.name, zone, operation_name, progress)
            except (UserError, asyncio.CancelledError) as exc:
                cancelled = isinstance(exc, asyncio.CancelledError)
                outcome_now = capacity.CANCELLED if cancelled else capacity.FAILED
                self.capacity_finish(path, outcome_now, str(exc) or None)
                raise
            if isinstance(outcome, Node):
                waited = time.monotonic() - started
                self.capacity_finish(path, capacity.READY, None, active_after_s=waited, ready_after_s=waited)
                return outcome
            self.capacity_finish(path, capacity_outcome(outcome), outcome.message)
            self._stop_unless_next_zone(outcome, request.name, zone)
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

    def _stop_unless_next_zone(self, failure: ApiFailure, name: str, zone: str) -> None:
        if failure.kind.tries_next_zone:
            return
        fix = f"; {failure.fix()}" if failure.fix() else ""
        error = AlreadyExists if failure.kind is FailureKind.EXISTS else UserError
        raise error(f"create {name} in {zone}: {failure.describe()}{fix}")

    async def _await_ready(
        self, name: str, zone: str, operation_name: str, progress: Progress
    ) -> Node | ApiFailure:
        """Follow a create until the node is READY (returns it) or the operation fails (returns why).

        Reports each state change with the time since the create was accepted: the state timeline.
        """
        api = await self._client()
        path = node_path(self.project, zone, name)
        started = time.monotonic()
        last_state: NodeState | None = None
        while True:
            operation = await api.get_operation(operation_name)
            if operation.done and operation.error.code:
                failure = classify_operation_error(operation.error.code, operation.error.message)
                await self._remove_failed_node(path, zone, progress)
                return failure
            try:
                node = self._model(await api.get_node(path))
            except API_ERRORS as exc:
                if classify_exception(exc).kind is not FailureKind.NOT_FOUND:
                    raise
                node = None  # not visible yet
            if node is not None and node.state != last_state:
                last_state = node.state
                elapsed = _format_duration(time.monotonic() - started)
                reason = f" ({node.state_reason})" if node.state_reason and node.state in _DEAD_STATES else ""
                progress(f"{zone}: {node.state}{reason} after {elapsed}")
            if node is not None and node.state is NodeState.READY:
                return node
            if node is not None and node.state in _DEAD_STATES:
                hint = state_hint(node) or f"delete it with `tpu-console delete {name} --yes`"
                raise UserError(f"{name} in {zone} became {node.state} while being created; {hint}")
            if time.monotonic() - started > self.create_timeout:
                raise UserError(
                    f"{name} in {zone} is still {last_state or 'not visible'} after "
                    f"{_format_duration(self.create_timeout)}; watch it with `tpu-console ls`"
                )
            await asyncio.sleep(self.poll_interval)

    async def _remove_failed_node(self, path: str, zone: str, progress: Progress) -> None:
        """A failed create can leave the node behind in a failed state; remove it so it holds nothing."""
        api = await self._client()
        try:
            await api.get_node(path)
        except API_ERRORS:
            return  # gone (the usual case) or unreadable: nothing more to do here
        progress(f"{zone}: removing the node the failed create left behind")
        try:
            operation_name = await api.delete_node(path)
            await api.wait_operation(operation_name, self.delete_timeout)
        except API_ERRORS as exc:
            progress(f"{zone}: could not remove it ({classify_exception(exc).describe()}); delete it by hand")

    # ---- adopt ------------------------------------------------------------------------------------

    async def adopt(self, name: str) -> Node:
        """Put this console's marks on a node made elsewhere (gcloud, another tool), its other labels
        kept; refused for a node another person's console made. A multislice: every slice."""
        try:
            api_nodes = [await self._find(name)]
        except NotFound:
            group = await self._find_multislice(name)
            if group is None:
                raise
            api_nodes = group[1]
        for api_node in api_nodes:
            await self._adopt_one(name, api_node)
        return await self.get(name)

    async def _adopt_one(self, name: str, api_node) -> None:
        current = dict(api_node.labels)
        marks = self.console_marks()
        someone = labels.owner(current)
        if someone and someone != marks.get(labels.USER):
            raise UserError(f"node {name} is {someone}'s (label {labels.USER}={someone}); it is not adopted "
                            "from another person's console")
        if all(current.get(k) == v for k, v in marks.items()):
            return
        api = await self._client()
        try:
            operation_name = await api.update_labels(api_node.name, {**current, **marks})
            operation = await api.wait_operation(operation_name, self.delete_timeout)
        except API_ERRORS as exc:
            failure = classify_exception(exc)
            raise UserError(f"could not label {name}: {failure.describe()}") from None
        if operation.error.code:
            raise UserError(f"could not label {name}: {operation.error.message}")

    # ---- delete -----------------------------------------------------------------------------------

    async def delete(self, name: str, progress: Progress = no_progress) -> None:
        """Delete the node (through its queued request, when it has one) and wait until it is gone; or a
        queued request without a node. The caller has already asked for confirmation."""
        api = await self._client()
        try:
            node = self._model(await self._find(name))
        except NotFound:
            group = await self._find_multislice(name)
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
            self._capacity_ended(node)
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
            operation = await api.wait_operation(operation_name, self.delete_timeout)
        except TimeoutError:
            raise UserError(
                f"{name} is still being deleted after {_format_duration(self.delete_timeout)}; "
                "check `tpu-console ls` later"
            ) from None
        if operation.error.code:
            failure = classify_operation_error(operation.error.code, operation.error.message)
            raise UserError(f"delete {name} in {node.zone} failed: {failure.describe()}")
        progress(f"{node.zone}: {name} deleted after {_format_duration(time.monotonic() - started)}")
        self._capacity_ended(node)

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
        self._capacity_ended(group)

    def _capacity_ended(self, node: Node) -> None:
        if node.zone and (store := self._store()) is not None:
            try:
                store.mark_ended(self.project, node.zone, node.name, datetime.now(UTC))
            except sqlite3.Error:
                pass

    # ---- queued requests --------------------------------------------------------------------------

    async def find_request(self, name: str) -> QueuedRequest | None:
        """The queued request called `name` in the configured zones (every zone without any)."""
        api = await self._client()
        zones = self._zones() or ["-"]
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
        api = await self._client()
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
            if time.monotonic() - started > self.delete_timeout:
                raise UserError(f"queued request {name} in {zone} is still there after "
                                f"{_format_duration(self.delete_timeout)}; check `tpu-console ls` later")
            await asyncio.sleep(self.poll_interval)
        progress(f"{zone}: queued request {name} deleted, confirmed gone after "
                 f"{_format_duration(time.monotonic() - started)}")

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
            self.capacity_finish(path, capacity.CANCELLED, "cancelled while waiting")

        await try_every(cancel(item) for item in requests)

    def supervisor_delete_target(self, node: Node) -> dict[str, Any] | None:
        """The supervisor deletes the node through the TPU API with the VM's own service account (`create`
        gives it one with the cloud-platform scope). `queued_resource`: a node made through a queued
        resource request names it (`queued_request`); deleting the node alone would leave it queued."""
        queued = getattr(node, "queued_request", None)  # absent from models that predate queued requests
        zone = node.zone or "-"
        return {
            "kind": "gcp",
            "api": self._settings.api_endpoint,
            "node": node_path(self.project, zone, node.name),
            "queued_resource": f"projects/{self.project}/locations/{zone}/queuedResources/{queued}"
            if queued else None,
        }

    # ---- ssh --------------------------------------------------------------------------------------

    async def ssh_targets(self, node: Node) -> list[SshTarget]:
        """Every worker of the node; of a multislice, every worker of every slice, numbered slice by
        slice (slice 0's hosts first), each slice's host keys pinned on its own node."""
        if node.slices > 1:
            group = await self._find_multislice(node.queued_request or node.name)
            if group is None:
                raise NotFound(f"gcp multislice {node.name!r} is gone from {node.zone}")
            current, api_nodes = group
        else:
            api_node = await self._find(node.name) if node.zone is None else await self._get_fresh(node)
            current, api_nodes = self._model(api_node), [api_node]
        if current.state is not NodeState.READY:
            hint = state_hint(current) or ""
            raise UserError(
                f"cannot connect to {current.name}: it is {current.state}, not READY"
                + (f"; {hint}" if hint else "")
            )
        username = await self._login(api_nodes)
        client_key = ssh_identity.client_key_path()
        targets: list[SshTarget] = []
        for api_node in api_nodes:  # in slice order: worker indexes go on from the slice before
            one = self._model(api_node)
            observed = await self._host_keys(api_node.name, len(one.workers))
            trusted = ssh_access.check_and_pin(api_node.name, str(api_node.id), observed)
            for worker, keys_of_worker in zip(one.workers, trusted, strict=True):
                if not worker.host:
                    raise UserError(
                        f"worker {worker.index} of {one.name} has no IP address yet; retry shortly"
                    )
                targets.append(
                    SshTarget(
                        worker=len(targets),
                        host=worker.host,
                        port=worker.port,
                        username=username,
                        client_key=client_key,
                        host_keys=keys_of_worker,
                    )
                )
        return targets

    async def _login(self, api_nodes: list) -> str:
        """Install the console's key (OS Login, once; or each node's ssh-keys metadata) and return the
        user the console logs in as."""
        api = await self._client()
        public_key = ssh_identity.public_key_line()
        metadata = dict(api_nodes[0].metadata)
        if self._settings.oslogin_user or ssh_access.oslogin_enabled(metadata):
            if not self._settings.oslogin_user:
                raise UserError(
                    f'{api_nodes[0].name.rsplit("/", 1)[-1]} uses OS Login: set [gcp] oslogin_user = '
                    '"you@example.com" (your Google account) in config.toml'
                )
            credentials = await asyncio.to_thread(load_credentials, self._settings.api_endpoint)
            return await ssh_access.import_oslogin_key(
                credentials,
                oslogin_endpoint(self._settings),
                self._settings.oslogin_user,
                public_key,
            )
        username = self._settings.ssh_user
        await try_every(
            ssh_access.ensure_metadata_key(api, api_node.name, username, public_key,
                                           retry_delay=self.poll_interval)
            for api_node in api_nodes
        )
        return username

    async def _get_fresh(self, node: Node):
        try:
            return await (await self._client()).get_node(node_path(self.project, node.zone or "-", node.name))
        except API_ERRORS as exc:
            failure = classify_exception(exc)
            if failure.kind is FailureKind.NOT_FOUND:
                raise NotFound(f"gcp node {node.name!r} is gone from {node.zone}") from None
            raise UserError(f"could not read {node.name}: {failure.describe()}") from None

    async def _host_keys(self, path: str, workers: int) -> list[list[str]]:
        """Host keys of every worker; a node that has just become READY may need a moment to publish."""
        api = await self._client()
        deadline = time.monotonic() + self.host_key_wait
        while True:
            observed = ssh_access.host_keys_from_guest_attributes(
                await api.guest_attributes(path, ssh_access.HOST_KEYS_QUERY)
            )
            missing = [i for i in range(workers) if i >= len(observed) or not observed[i]]
            if not missing:
                return observed[:workers]
            if time.monotonic() >= deadline:
                raise UserError(
                    f"workers {', '.join(map(str, missing))} of {path} have not published their "
                    "SSH host keys (guest attributes); retry in a minute"
                )
            await asyncio.sleep(self.poll_interval)


def _validate_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise UserError(
                f"invalid label {key}={value}: keys start with a lowercase letter, keys and values "
                "use lowercase letters, digits, '_' and '-', at most 63 characters"
            )

