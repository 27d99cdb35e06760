"""The gcp provider: Cloud TPU VMs through the TPU v2 API.

Here: the clients, listing every configured zone at once, finding a node or a multislice by name, a create's
checks (nothing is sent before the request is known to be well-formed), adopting a node made elsewhere. The
rest is one module each: a create through a queued resource (queued.py) or the Create Node API
(direct_create.py), deleting and waiting (delete.py), reaching the workers (ssh_targets.py), and the
capacity record (capacity_record.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from datetime import UTC, datetime
from typing import Any

from tpu_console.domain import CreateRequest, Node, QueuedRequest, SshTarget, validate_node_name
from tpu_console.errors import NotFound, UserError
from tpu_console.providers.base import NodeListing, Progress, Provider, no_progress
from tpu_console.providers.gcp import accelerators, labels, multislice
from tpu_console.providers.gcp.alpha import AlphaApi
from tpu_console.providers.gcp.capacity_record import CapacityRecord
from tpu_console.providers.gcp.client import TpuApi, load_credentials, make_tpu_client, require_project
from tpu_console.providers.gcp.delete import Deletion
from tpu_console.providers.gcp.direct_create import DirectCreate
from tpu_console.providers.gcp.errors import API_ERRORS, FailureKind, classify_exception
from tpu_console.providers.gcp.node_mapping import maintenance_of, node_path, split_node_path, to_model_node
from tpu_console.providers.gcp.queued import QueuedCreate
from tpu_console.providers.gcp.queued_mapping import (
    node_name_of,
    queued_path,
    slice_ids,
    split_queued_path,
    supports_queued,
    to_queued_request,
)
from tpu_console.providers.gcp.ssh_targets import ssh_targets
from tpu_console.settings import Settings

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


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
        self.capacity = CapacityRecord(self.name, lambda: self.project)
        self._deletion = Deletion(self)

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
        self.capacity.note_preempted(listing.nodes, datetime.now(UTC))
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
        return await DirectCreate(self, request, accelerator_type, runtime, progress).run(zones)

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
        await self._deletion.delete(name, progress)

    async def delete_request(self, path: str, zone: str, progress: Progress = no_progress) -> None:
        """Delete a queued request (with its node, if it has one) and confirm it is gone."""
        await self._deletion.delete_request(path, zone, progress)

    async def delete_queued(self, request: QueuedRequest, progress: Progress = no_progress) -> None:
        await self._deletion.delete_queued(request, progress)

    async def cancel_requests(self, requests: list[str], progress: Progress = no_progress) -> None:
        await self._deletion.cancel_requests(requests, progress)

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
        return await ssh_targets(self, node)


def _validate_labels(labels: dict[str, str]) -> None:
    for key, value in labels.items():
        if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise UserError(
                f"invalid label {key}={value}: keys start with a lowercase letter, keys and values "
                "use lowercase letters, digits, '_' and '-', at most 63 characters"
            )

