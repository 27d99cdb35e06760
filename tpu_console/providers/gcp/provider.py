"""The gcp provider: Cloud TPU VMs through the TPU v2 API.

List across the configured zones at once; create with zone fallback (only a stockout or a missing
reservation moves on to the next zone); delete and wait; SSH access with the console's key in node
metadata (or OS Login) and host keys pinned from guest attributes.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

from tpu_console import keys
from tpu_console.errors import AlreadyExists, NotFound, UserError
from tpu_console.model import CreateRequest, Node, NodeState, SshTarget, validate_node_name
from tpu_console.providers.base import NodeListing, Progress, Provider, no_progress
from tpu_console.providers.gcp import accelerators, ssh_access
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
from tpu_console.providers.gcp.node_mapping import node_path, state_hint, to_model_node
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

    # ---- plumbing ---------------------------------------------------------------------------------

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

    def _zones(self, zones: tuple[str, ...] | list[str] = ()) -> list[str]:
        return [z for z in (zones or self._settings.zones) if z]

    def _model(self, api_node) -> Node:
        return to_model_node(api_node, internal_ip=self._settings.internal_ip)

    async def close(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    # ---- list / get -------------------------------------------------------------------------------

    async def list_nodes(self) -> NodeListing:
        api = await self._client()
        zones = self._zones() or ["-"]  # "-": every location the project has nodes in
        answers = await asyncio.gather(
            *(api.list_nodes(f"projects/{self.project}/locations/{zone}") for zone in zones),
            return_exceptions=True,
        )
        listing = NodeListing()
        for zone, answer in zip(zones, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                where = "all zones" if zone == "-" else f"zone {zone}"
                listing.problems.append(f"{where}: {classify_exception(answer).describe()}")
                continue
            listing.nodes.extend(self._model(api_node) for api_node in answer)
        listing.nodes.sort(key=lambda node: (node.zone or "", node.name))
        return listing

    async def get(self, name: str) -> Node:
        api_node = await self._find(name)
        return self._model(api_node)

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
        api = await self._client()
        kind = "spot" if request.spot else "on-demand"
        spec = tpu_v2.Node(
            accelerator_type=accelerator_type,
            runtime_version=runtime,
            scheduling_config=tpu_v2.SchedulingConfig(spot=request.spot),
            network_config=tpu_v2.NetworkConfig(enable_external_ips=True),
            # The VM's own credentials (the metadata server's token) let the run's supervisor delete it.
            service_account=tpu_v2.ServiceAccount(scope=[CLOUD_PLATFORM_SCOPE]),
            labels={"created-by": "tpu-console", **request.labels},
        )

        progress("the VM runs as the project's default service account with the cloud-platform scope, so "
                 "a run's supervisor can delete it (launch --on-end delete)")
        tried: list[str] = []
        for index, zone in enumerate(zones):
            more = index + 1 < len(zones)
            progress(f"{zone}: creating {accelerator_type} ({kind}, {runtime})")
            try:
                operation_name = await api.create_node(
                    f"projects/{self.project}/locations/{zone}", request.name, spec
                )
            except API_ERRORS as exc:
                failure = classify_exception(exc)
                self._stop_unless_next_zone(failure, request.name, zone)
                tried.append(f"{zone} {failure.kind}")
                progress(f"{zone}: {failure.kind}" + (", trying next zone" if more else ""))
                continue
            progress(f"{zone}: accepted, waiting for READY")
            outcome = await self._await_ready(request.name, zone, operation_name, progress)
            if isinstance(outcome, Node):
                return outcome
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

    # ---- delete -----------------------------------------------------------------------------------

    async def delete(self, name: str, progress: Progress = no_progress) -> None:
        """Delete the node and wait until it is gone. The caller has already asked for confirmation."""
        api = await self._client()
        node = self._model(await self._find(name))
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
        api = await self._client()
        api_node = await self._find(node.name) if node.zone is None else await self._get_fresh(node)
        current = self._model(api_node)
        if current.state is not NodeState.READY:
            hint = state_hint(current) or ""
            raise UserError(
                f"cannot connect to {current.name}: it is {current.state}, not READY"
                + (f"; {hint}" if hint else "")
            )
        path = api_node.name
        public_key = keys.public_key_line()
        metadata = dict(api_node.metadata)
        if self._settings.oslogin_user or ssh_access.oslogin_enabled(metadata):
            if not self._settings.oslogin_user:
                raise UserError(
                    f'{current.name} uses OS Login: set [gcp] oslogin_user = "you@example.com" '
                    "(your Google account) in config.toml"
                )
            credentials = await asyncio.to_thread(load_credentials, self._settings.api_endpoint)
            username = await ssh_access.import_oslogin_key(
                credentials,
                oslogin_endpoint(self._settings),
                self._settings.oslogin_user,
                public_key,
            )
        else:
            username = self._settings.ssh_user
            await ssh_access.ensure_metadata_key(
                api, path, username, public_key, retry_delay=self.poll_interval
            )
        observed = await self._host_keys(path, len(current.workers))
        trusted = ssh_access.check_and_pin(path, str(api_node.id), observed)
        client_key = keys.client_key_path()
        targets = []
        for worker, keys_of_worker in zip(current.workers, trusted, strict=True):
            if not worker.host:
                raise UserError(
                    f"worker {worker.index} of {current.name} has no IP address yet; retry shortly"
                )
            targets.append(
                SshTarget(
                    worker=worker.index,
                    host=worker.host,
                    port=worker.port,
                    username=username,
                    client_key=client_key,
                    host_keys=keys_of_worker,
                )
            )
        return targets

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


def _format_duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
