"""A Cloud TPU v2 REST API emulator, served over plain HTTP on 127.0.0.1, for tests and demos.

It speaks the REST surface `google.cloud.tpu_v2.TpuClient(transport="rest")` uses: nodes list/get/create/
delete/patch, `:getGuestAttributes`, long-running operations, and the OS Login `importSshPublicKey` call.
State changes happen over (configurable, short) time: a created node is CREATING, then READY; a deleted
node is DELETING, then gone. Failures are injected per test: a zone out of capacity, a zone whose
reservation is missing, a quota error, any HTTP error for the next N calls of a method (a 409 on update,
5xx then success), and preemption of a READY node.

Queued resources (`queuedResources`: create, get, list, delete with `force`) move through ACCEPTED,
WAITING_FOR_RESOURCES, PROVISIONING and ACTIVE on injectable delays, one state per read of the request
(so a client that polls sees every state, however slow the machine): capacity that appears in a zone
only after a wait (`capacity_after`), a zone that never has any (`stockout`: the request waits until its
valid-until passes, then FAILED), failure with a reason (`fail_queued`, a missing reservation), and
suspension (`suspend`). A multislice request (`multisliceParams {nodeCount, nodeIdPrefix}`, v4 and later)
makes nodes PREFIX-0 .. PREFIX-<N-1>, each with its own network endpoints and `multisliceNode`; one slice
can fail while provisioning (`fail_slice`: the request FAILED, the other slices left until it is deleted)
and each can be preempted alone (`preempt` by its node name); deleting the request with `force` deletes
every slice. The `v2alpha1` paths answer too, with the fields only that version has
(`upcomingMaintenance` on nodes, `bestEffort` on requests).

Standalone, for trying the console without a cloud project:

    python tests/tpu_api_emulator.py --port 8470 --demo
    TPU_CONSOLE_GCP_API_ENDPOINT=http://127.0.0.1:8470 tpu-console ls --project demo

It deliberately shares no code with tpu_console, so a wrong assumption in the provider cannot hide
behind the same wrong assumption here.
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_TYPE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-(\d+)$")
_PREFIX = re.compile(r"^[A-Za-z0-9_.~+%-]+$")  # nodeIdPrefix, as the API reference states it
# GCP label rules: keys start with a lowercase letter; keys and values lowercase letters, digits, _ and -
_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def _check_labels(labels: Any) -> None:
    """The API refuses a label that breaks its rules (as it would a console's unsanitised user name)."""
    for key, value in (labels or {}).items():
        if not _LABEL.match(str(key)) or not _LABEL_VALUE.match(str(value)):
            raise ApiError("INVALID_ARGUMENT", f"Invalid label {key}={value}.")

# HTTP status for each google.rpc code the emulator returns.
_HTTP_FOR_STATUS = {
    "INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409, "ABORTED": 409, "RESOURCE_EXHAUSTED": 429, "INTERNAL": 500,
    "UNAVAILABLE": 503, "UNAUTHENTICATED": 401,
}
_RPC_CODE = {
    "INVALID_ARGUMENT": 3, "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8, "FAILED_PRECONDITION": 9, "ABORTED": 10, "INTERNAL": 13, "UNAVAILABLE": 14,
}


def worker_count(accelerator_type: str) -> int:
    """Hosts per slice, from the public Cloud TPU docs (independent of the console's own table)."""
    match = _TYPE.match(accelerator_type)
    assert match, accelerator_type
    family, size = match.group(1), int(match.group(2))
    if family in ("v5litepod", "v6e"):  # size counts chips; up to 8 chips on one host, then 4 per host
        return 1 if size <= 8 else size // 4
    return max(1, size // 8)  # size counts TensorCores; 8 per host


def fake_host_key(seed: bytes | None = None) -> str:
    """A well-formed `ssh-ed25519 <base64>` public key line (random 32-byte point; nobody signs with it)."""
    raw = seed if seed is not None else os.urandom(32)
    kind = b"ssh-ed25519"
    blob = len(kind).to_bytes(4, "big") + kind + len(raw).to_bytes(4, "big") + raw
    return "ssh-ed25519 " + base64.b64encode(blob).decode()


class ApiError(Exception):
    def __init__(self, status: str, message: str, http: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.http = http or _HTTP_FOR_STATUS.get(status, 500)

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.http, "message": self.message, "status": self.status}}

    def rpc_status(self) -> dict[str, Any]:
        return {"code": _RPC_CODE.get(self.status, 2), "message": self.message}


@dataclass
class _Injected:
    method: str  # "create", "get", "list", "delete", "update", "guestAttributes", "operation"
    error: ApiError
    remaining: int
    zone: str | None = None


@dataclass
class _Node:
    project: str
    zone: str
    node_id: str
    body: dict[str, Any]  # the Node JSON as the API returns it
    ready_at: float | None = None
    gone_at: float | None = None
    host_keys: list[list[str]] = field(default_factory=list)  # per worker, "type base64" lines

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/nodes/{self.node_id}"


@dataclass
class _Queued:
    project: str
    zone: str
    qr_id: str
    body: dict[str, Any]  # the QueuedResource JSON as the API returns it
    created: float  # time.monotonic() when created
    capacity_at: float | None  # when capacity appears for it (None: never)
    valid_until: float | None = None
    fail_with: ApiError | None = None  # FAILED with this once accepted
    state_since: float = 0.0
    failed_slice: tuple[int, ApiError] | None = None  # a multislice's slice that fails while provisioning

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.qr_id}"

    @property
    def node_ids(self) -> list[str]:
        """The nodes it makes: its nodeId, or for a multislice PREFIX-0 .. PREFIX-<nodeCount-1>."""
        spec = self.body["tpu"]["nodeSpec"][0]
        params = spec.get("multisliceParams") or spec.get("multiNodeParams")
        if params is None:
            return [spec["nodeId"]]
        prefix = params.get("nodeIdPrefix") or self.qr_id
        return [f"{prefix}-{i}" for i in range(int(params["nodeCount"]))]


@dataclass
class _Operation:
    name: str
    verb: str
    target: str
    created: str
    done_at: float
    error: ApiError | None = None
    on_done: Any = None  # callable run once when the operation completes
    finished: bool = False


class TpuApiEmulator:
    """The service state plus failure injection. Thread-safe; serve it with `start()`."""

    def __init__(self, *, create_delay: float = 0.05, delete_delay: float = 0.05, update_delay: float = 0.02,
                 queue_delay: float = 0.05):
        self.create_delay = create_delay
        self.delete_delay = delete_delay
        self.update_delay = update_delay
        self.queue_delay = queue_delay  # each queued state lasts this long, capacity permitting
        self._queued: dict[tuple[str, str, str], _Queued] = {}
        self._capacity_after: dict[str, float] = {}
        self._queued_failures: dict[str, ApiError] = {}
        self._slice_failures: dict[str, tuple[int, ApiError]] = {}
        self.queued_created: list[dict[str, Any]] = []  # every QueuedResource body as sent, with its URL
        self._lock = threading.RLock()
        self._nodes: dict[tuple[str, str, str], _Node] = {}
        self._operations: dict[str, _Operation] = {}
        self._ids = itertools.count(1000)
        self._injected: list[_Injected] = []
        self._stockout: set[str] = set()
        self._no_reservation: set[str] = set()
        self._quota: set[str] = set()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every call, for assertions
        self.create_attempts: list[str] = []  # zones create_node was called in, in order
        self.nodes_made: list[str] = []  # every node made, by name (a multislice's slices too), in order
        self.oslogin_keys: dict[str, list[str]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- serving ------------------------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Serve on 127.0.0.1:`port` (0 picks a free one) in a daemon thread; returns the endpoint URL."""
        emulator = self

        class Handler(_Handler):
            api = emulator

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="tpu-api-emulator", daemon=True)
        self._thread.start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the emulator first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- failure injection --------------------------------------------------------------------------

    def stockout(self, zone: str) -> None:
        """Creates in `zone` fail in the operation with RESOURCE_EXHAUSTED "no more capacity"."""
        self._stockout.add(zone)

    def missing_reservation(self, zone: str) -> None:
        """Creates in `zone` fail in the operation with "Reservation ... not found" (seen for v6e)."""
        self._no_reservation.add(zone)

    def quota_exceeded(self, zone: str) -> None:
        """Creates in `zone` are refused at once with a 429 naming the quota."""
        self._quota.add(zone)

    def capacity_after(self, zone: str, seconds: float) -> None:
        """Queued requests in `zone` wait this long (from their creation) before capacity appears."""
        self._capacity_after[zone] = seconds

    def fail_queued(self, zone: str, message: str, status: str = "RESOURCE_EXHAUSTED") -> None:
        """Queued requests in `zone` become FAILED with this error once accepted."""
        self._queued_failures[zone] = ApiError(status, message)

    def fail_slice(self, zone: str, index: int, message: str, status: str = "UNKNOWN") -> None:
        """Multislice requests in `zone`: slice `index` fails while provisioning; the request FAILED
        with this error, its other slices made (and left, holding quota, until it is deleted)."""
        self._slice_failures[zone] = (index, ApiError(status, message))

    def suspend(self, zone: str, name: str, reason: str = "The queued resource was suspended.") -> None:
        """The service suspends a request: SUSPENDED, its node (if any) gone."""
        with self._lock:
            queued = self._queued_in(zone, name)
            self._set_queued_state(queued, "SUSPENDED", time.monotonic(), suspendedData={})
            queued.body["state"]["stateInitiator"] = "SERVICE"
            queued.fail_with = ApiError("ABORTED", reason)
            self._nodes.pop((queued.project, zone, name), None)

    def set_maintenance(self, zone: str, name: str, start: str, end: str, kind: str = "SCHEDULED") -> None:
        """Announce maintenance for a node (RFC 3339 times); only v2alpha1 answers show it."""
        with self._lock:
            self._find(zone, name).body["upcomingMaintenance"] = {
                "type": kind, "canReschedule": True, "windowStartTime": start, "windowEndTime": end,
                "maintenanceStatus": "PENDING"}

    def set_symptom(self, zone: str, name: str, kind: str, details: str) -> None:
        with self._lock:
            self._find(zone, name).body.setdefault("symptoms", []).append(
                {"createTime": _rfc3339(time.time()), "symptomType": kind, "details": details,
                 "workerId": "0"})

    def add_queued(self, project: str, zone: str, name: str, accelerator_type: str, *,
                   state: str = "WAITING_FOR_RESOURCES", spot: bool = True,
                   labels: dict[str, str] | None = None) -> None:
        """Put a queued request straight into a state, as if made earlier (it does not move on)."""
        with self._lock:
            node = {"acceleratorType": accelerator_type, **({"labels": labels} if labels else {})}
            body = {"tpu": {"nodeSpec": [{"parent": f"projects/{project}/locations/{zone}", "nodeId": name,
                                          "node": node}]},
                    **({"spot": {}} if spot else {})}
            queued = self._new_queued(project, zone, name, body, capacity_at=None)
            self._set_queued_state(queued, state, time.monotonic())

    def add_multislice(self, project: str, zone: str, name: str, accelerator_type: str, slices: int,
                       spot: bool = True) -> None:
        """An ACTIVE multislice request and its READY nodes NAME-0 .. NAME-<slices-1>, as if made earlier."""
        with self._lock:
            node = {"acceleratorType": accelerator_type, "runtimeVersion": "v6e-ubuntu-2404"}
            body = {"tpu": {"nodeSpec": [{"parent": f"projects/{project}/locations/{zone}", "node": node,
                                          "multisliceParams": {"nodeCount": slices, "nodeIdPrefix": name}}]},
                    **({"spot": {}} if spot else {})}
            queued = self._new_queued(project, zone, name, body, capacity_at=None)
            self._set_queued_state(queued, "ACTIVE", time.monotonic(), activeData={})
            for node_id in queued.node_ids:
                self.add_node(project, zone, node_id, accelerator_type, spot=spot)
                self._find(zone, node_id, project).body.update(
                    {"queuedResource": queued.path, "multisliceNode": True})

    def queued_json(self, zone: str, name: str) -> dict[str, Any] | None:
        """A request as it stands (reading it here does not move it on), or None when it is gone."""
        with self._lock:
            self._advance()
            queued = self._queued.get(next((k for k in self._queued if k[1:] == (zone, name)), ("", "", "")))
            return json.loads(json.dumps(queued.body)) if queued else None

    def fail_next(self, method: str, status: str, message: str, times: int = 1, *, http: int | None = None,
                  zone: str | None = None) -> None:
        """The next `times` calls of `method` (in `zone`, if given) answer with this error."""
        with self._lock:
            self._injected.append(_Injected(method, ApiError(status, message, http), times, zone))

    def preempt(self, zone: str, name: str, reason: str = "The TPU was preempted.") -> None:
        with self._lock:
            node = self._find(zone, name)
            node.body["state"] = "PREEMPTED"
            node.body["health"] = "UNHEALTHY_MAINTENANCE"
            node.body["healthDescription"] = reason
            node.ready_at = None

    def set_host_key(self, zone: str, name: str, worker: int, line: str) -> None:
        with self._lock:
            self._find(zone, name).host_keys[worker] = [line]

    def add_node(
        self,
        project: str,
        zone: str,
        name: str,
        accelerator_type: str,
        *,
        state: str = "READY",
        spot: bool = True,
        metadata: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        runtime_version: str = "v6e-ubuntu-2404",
        external_ips: bool = True,
    ) -> dict[str, Any]:
        """Put a node straight into a state (no operation), as if created earlier."""
        with self._lock:
            node = self._new_node(
                project,
                zone,
                name,
                {
                    "acceleratorType": accelerator_type,
                    "runtimeVersion": runtime_version,
                    "schedulingConfig": {"spot": spot},
                    "metadata": metadata or {},
                    "labels": labels or {},
                    "networkConfig": {"enableExternalIps": external_ips},
                },
            )
            node.body["state"] = state
            if state == "READY":
                node.body["health"] = "HEALTHY"
            return json.loads(json.dumps(node.body))

    def node_json(self, zone: str, name: str, project: str | None = None) -> dict[str, Any]:
        with self._lock:
            self._advance()
            return json.loads(json.dumps(self._find(zone, name, project).body))

    def host_key_lines(self, zone: str, name: str) -> list[list[str]]:
        with self._lock:
            return [list(keys) for keys in self._find(zone, name).host_keys]

    # ---- the service ---------------------------------------------------------------------------------

    def handle(
        self, method: str, path: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> dict[str, Any]:
        with self._lock:
            self.requests.append((method, path))
            self._advance()
            if path.startswith("/v1/users/") and path.endswith(":importSshPublicKey"):
                return self._import_ssh_key(
                    path[len("/v1/users/") : -len(":importSshPublicKey")], body, query
                )
            match = re.fullmatch(r"/(v2|v2alpha1)/projects/([^/]+)/locations/([^/]+)(/.*)?", path)
            if not match:
                raise ApiError("NOT_FOUND", f"no such path {path}")
            alpha = match.group(1) == "v2alpha1"
            project, zone, rest = match.group(2), match.group(3), match.group(4) or ""
            if rest == "/nodes" and method == "GET":
                self._check_injected("list", zone)
                return self._list(project, zone, alpha)
            if rest.startswith("/queuedResources"):
                return self._queued_call(method, project, zone, rest, query, body, alpha)
            if rest == "/nodes" and method == "POST":
                return self._create(project, zone, query.get("nodeId", [""])[0], body)
            if m := re.fullmatch(r"/nodes/([^/:]+):getGuestAttributes", rest):
                self._check_injected("guestAttributes", zone)
                return self._guest_attributes(project, zone, m.group(1), body)
            if m := re.fullmatch(r"/nodes/([^/:]+)", rest):
                name = m.group(1)
                if method == "GET":
                    self._check_injected("get", zone)
                    return _version_view(self._find(zone, name, project).body, alpha)
                if method == "DELETE":
                    self._check_injected("delete", zone)
                    return self._delete(project, zone, name)
                if method == "PATCH":
                    self._check_injected("update", zone)
                    return self._update(project, zone, name, query, body)
            if m := re.fullmatch(r"/operations/([^/:]+)", rest):
                self._check_injected("operation", zone)
                return self._operation_json(f"projects/{project}/locations/{zone}/operations/{m.group(1)}")
            raise ApiError("NOT_FOUND", f"no such method {method} {path}")

    def _check_injected(self, method: str, zone: str) -> None:
        for injected in self._injected:
            if injected.method == method and injected.remaining > 0 and injected.zone in (None, zone):
                injected.remaining -= 1
                raise injected.error

    def _find(self, zone: str, name: str, project: str | None = None) -> _Node:
        for (p, z, n), node in self._nodes.items():
            if z == zone and n == name and (project is None or p == project):
                return node
        raise ApiError(
            "NOT_FOUND", f"Resource 'projects/{project}/locations/{zone}/nodes/{name}' was not found"
        )

    def _list(self, project: str, zone: str, alpha: bool = False) -> dict[str, Any]:
        nodes = [_version_view(n.body, alpha)
                 for (p, z, _), n in sorted(self._nodes.items()) if p == project and zone in ("-", z)]
        return {"nodes": nodes}

    # ---- queued resources ------------------------------------------------------------------------------

    def _queued_call(self, method: str, project: str, zone: str, rest: str, query: dict[str, list[str]],
                     body: dict[str, Any], alpha: bool) -> dict[str, Any]:
        if rest == "/queuedResources" and method == "GET":
            self._check_injected("listQueued", zone)
            listed = [q for (p, z, _), q in sorted(self._queued.items()) if p == project and zone in ("-", z)]
            self._advance_queued(time.monotonic(), listed)
            return {"queuedResources": [_version_view(q.body, alpha) for q in listed]}
        if rest == "/queuedResources" and method == "POST":
            return self._create_queued(project, zone, query.get("queuedResourceId", [""])[0], body, alpha)
        m = re.fullmatch(r"/queuedResources/([^/:]+)", rest)
        if m and method == "GET":
            self._check_injected("getQueued", zone)
            queued = self._queued_in(zone, m.group(1), project)
            self._advance_queued(time.monotonic(), [queued])
            return _version_view(queued.body, alpha)
        if m and method == "DELETE":
            self._check_injected("deleteQueued", zone)
            return self._delete_queued(project, zone, m.group(1), query.get("force", [""])[0] == "true")
        raise ApiError("NOT_FOUND", f"no such method {method} {rest}")

    def _queued_in(self, zone: str, name: str, project: str | None = None) -> _Queued:
        for (p, z, n), queued in self._queued.items():
            if z == zone and n == name and (project is None or p == project):
                return queued
        raise ApiError("NOT_FOUND",
                       f"Resource 'projects/{project}/locations/{zone}/queuedResources/{name}' was not found")

    def _new_queued(self, project: str, zone: str, name: str, body: dict[str, Any],
                    capacity_at: float | None) -> _Queued:
        now = time.monotonic()
        stored = json.loads(json.dumps(body))
        stored["name"] = f"projects/{project}/locations/{zone}/queuedResources/{name}"
        stored["createTime"] = _rfc3339(time.time())
        queued = _Queued(project, zone, name, stored, now, capacity_at)
        self._set_queued_state(queued, "CREATING", now, creatingData={})
        self._queued[(project, zone, name)] = queued
        return queued

    def _create_queued(self, project: str, zone: str, name: str, body: dict[str, Any],
                       alpha: bool) -> dict[str, Any]:
        self.create_attempts.append(zone)
        self.queued_created.append({"zone": zone, "id": name, "alpha": alpha, "body": body})
        self._check_injected("createQueued", zone)
        if not _NODE_NAME.match(name):
            raise ApiError("INVALID_ARGUMENT", f"Invalid value for field 'queuedResourceId': '{name}'.")
        specs = body.get("tpu", {}).get("nodeSpec", [])
        if len(specs) != 1 or not _TYPE.match(specs[0].get("node", {}).get("acceleratorType", "")):
            raise ApiError("INVALID_ARGUMENT", "tpu.nodeSpec needs one node with a known acceleratorType.")
        _check_labels(specs[0].get("node", {}).get("labels"))
        _check_multislice(specs[0], alpha)
        if "bestEffort" in body and not alpha:
            raise ApiError("INVALID_ARGUMENT", "Unknown field 'bestEffort' (it exists in v2alpha1 only).")
        queued = _Queued(project, zone, name, json.loads(json.dumps(body)), 0.0, None)
        if any(z == zone and n == name for (_, z, n) in self._queued) or any(
            z == zone and n in queued.node_ids for (_, z, n) in self._nodes
        ):
            raise ApiError("ALREADY_EXISTS", f"Resource '{name}' already exists in {zone}")
        if zone in self._quota:
            raise ApiError("RESOURCE_EXHAUSTED",
                           f"Quota limit 'TPUQueuedResourcesPerProjectPerZone' has been exceeded in {zone}.")
        now = time.monotonic()
        wait = self._capacity_after.get(zone, self.queue_delay)
        capacity_at = None if zone in self._stockout else now + wait
        queued = self._new_queued(project, zone, name, body, capacity_at)
        if until := body.get("queueingPolicy", {}).get("validUntilDuration"):
            queued.valid_until = now + float(until.rstrip("s"))
        if zone in self._no_reservation:
            queued.fail_with = ApiError(
                "NOT_FOUND",
                f"Reservation {body.get('reservationName') or 'for ' + zone} not found in {zone}.")
        elif zone in self._queued_failures:
            queued.fail_with = self._queued_failures[zone]
        if len(queued.node_ids) > 1 and zone in self._slice_failures:
            queued.failed_slice = self._slice_failures[zone]
        return self._new_operation(project, zone, "create", queued.path, 0.0, None)

    def _delete_queued(self, project: str, zone: str, name: str, force: bool) -> dict[str, Any]:
        queued = self._queued_in(zone, name, project)
        node_ids = queued.node_ids
        nodes = [n for i in node_ids if (n := self._nodes.get((project, zone, i))) is not None]
        if nodes and not force:
            raise ApiError("FAILED_PRECONDITION",
                           f"Queued resource {name} has a node; delete it with force=true to delete both")
        self._set_queued_state(queued, "DELETING", time.monotonic(), deletingData={})
        for node in nodes:
            node.body["state"] = "DELETING"
            node.ready_at = None
        key = (project, zone, name)

        def gone() -> None:
            self._queued.pop(key, None)
            for node_id in node_ids:
                self._nodes.pop((project, zone, node_id), None)

        return self._new_operation(project, zone, "delete", queued.path, self.delete_delay, None,
                                   on_done=gone)

    def _set_queued_state(self, queued: _Queued, state: str, now: float, **data: Any) -> None:
        queued.body["state"] = {"state": state, **data}
        queued.state_since = now

    def _advance_queued(self, now: float, queued_resources: list[_Queued]) -> None:
        """Move each request on by one state whose time has come. Requests move when they are read (get,
        list), one state per read, so a client polling a request sees every state it passes through."""
        for queued in queued_resources:
            state = queued.body["state"]["state"]
            if now - queued.state_since < self.queue_delay and state in ("CREATING", "ACCEPTED"):
                continue
            if state == "CREATING":
                self._set_queued_state(queued, "ACCEPTED", now, acceptedData={})
            elif state == "ACCEPTED" and queued.fail_with is not None:
                error = queued.fail_with
                self._set_queued_state(queued, "FAILED", now, failedData={"error": error.rpc_status()})
            elif state == "ACCEPTED":
                self._set_queued_state(queued, "WAITING_FOR_RESOURCES", now)
            elif state == "WAITING_FOR_RESOURCES":
                if queued.valid_until is not None and now >= queued.valid_until and (
                        queued.capacity_at is None or queued.capacity_at > now):
                    error = ApiError("RESOURCE_EXHAUSTED", f"There is no more capacity in the zone "
                                     f'"{queued.zone}"; the request expired at its valid-until time.')
                    self._set_queued_state(queued, "FAILED", now, failedData={"error": error.rpc_status()})
                elif queued.capacity_at is not None and now >= queued.capacity_at:
                    self._set_queued_state(queued, "PROVISIONING", now, provisioningData={})
            elif state == "PROVISIONING" and now - queued.state_since >= self.queue_delay:
                spec = queued.body["tpu"]["nodeSpec"][0]
                node_ids = queued.node_ids
                failed = queued.failed_slice[0] if queued.failed_slice else None
                for index, node_id in enumerate(node_ids):
                    if index == failed:
                        continue
                    node_body = json.loads(json.dumps(spec.get("node", {})))
                    node_body.setdefault("schedulingConfig", {"spot": "spot" in queued.body})
                    node_body.setdefault("networkConfig", {"enableExternalIps": True})
                    node = self._new_node(queued.project, queued.zone, node_id, node_body)
                    node.body["queuedResource"] = queued.path
                    if len(node_ids) > 1:
                        node.body["multisliceNode"] = True
                    node.ready_at = now + self.create_delay
                if queued.failed_slice is not None:
                    error = queued.failed_slice[1]
                    self._set_queued_state(queued, "FAILED", now, failedData={"error": error.rpc_status()})
                else:
                    self._set_queued_state(queued, "ACTIVE", now, activeData={})

    def _new_node(self, project: str, zone: str, name: str, spec: dict[str, Any]) -> _Node:
        node_id = str(next(self._ids))
        body = dict(spec)
        body["name"] = f"projects/{project}/locations/{zone}/nodes/{name}"
        body["id"] = node_id
        body["state"] = "CREATING"
        body["apiVersion"] = "V2"
        body["createTime"] = _rfc3339(time.time())
        workers = worker_count(spec["acceleratorType"])
        external = spec.get("networkConfig", {}).get("enableExternalIps", False)
        octet = int(node_id) % 200 + 10
        body["networkEndpoints"] = [
            {
                "ipAddress": f"10.{octet}.0.{i + 2}",
                "port": 8470,
                **({"accessConfig": {"externalIp": f"34.{octet}.1.{i + 2}"}} if external else {}),
            }
            for i in range(workers)
        ]
        body["cidrBlock"] = f"10.{octet}.0.0/24"
        node = _Node(project, zone, name, body, host_keys=[[fake_host_key()] for _ in range(workers)])
        self._nodes[(project, zone, name)] = node
        self.nodes_made.append(name)
        return node

    def _create(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.create_attempts.append(zone)
        self._check_injected("create", zone)
        if not _NODE_NAME.match(name):
            raise ApiError("INVALID_ARGUMENT", f"Invalid value for field 'nodeId': '{name}'.")
        _check_labels(body.get("labels"))
        if not _TYPE.match(body.get("acceleratorType", "")):
            raise ApiError("INVALID_ARGUMENT", f"Accelerator type '{body.get('acceleratorType')}' not found.")
        if not body.get("runtimeVersion"):
            raise ApiError("INVALID_ARGUMENT", "Field 'runtimeVersion' is required.")
        if any(z == zone and n == name for (_, z, n) in self._nodes):
            raise ApiError(
                "ALREADY_EXISTS",
                f"Resource 'projects/{project}/locations/{zone}/nodes/{name}' already exists",
            )
        if zone in self._quota:
            kind = "Preemptible" if body.get("schedulingConfig", {}).get("spot") else ""
            family = body["acceleratorType"].split("-")[0].upper()
            raise ApiError(
                "RESOURCE_EXHAUSTED",
                f"Quota limit 'TPU{family}{kind}PodPerProjectPerZoneForTPUAPI' "
                f"has been exceeded. Limit: 0 in zone {zone}.",
            )
        node = self._new_node(project, zone, name, body)
        error = None
        if zone in self._stockout:
            error = ApiError(
                "RESOURCE_EXHAUSTED",
                f'There is no more capacity in the zone "{zone}"; you can '
                "try in another zone where Cloud TPU Nodes are offered",
            )
        elif zone in self._no_reservation:
            error = ApiError(
                "NOT_FOUND",
                f"Reservation projects/{project}/reservations/tpu-{zone} not found in zone {zone}.",
            )
        if error is None:
            node.ready_at = time.monotonic() + self.create_delay
        key = (project, zone, name)
        return self._new_operation(
            project,
            zone,
            "create",
            node.path,
            self.create_delay,
            error,
            on_done=(lambda: self._nodes.pop(key, None)) if error else None,
        )

    def _delete(self, project: str, zone: str, name: str) -> dict[str, Any]:
        node = self._find(zone, name, project)
        node.body["state"] = "DELETING"
        node.ready_at = None
        key = (project, zone, name)
        return self._new_operation(
            project,
            zone,
            "delete",
            node.path,
            self.delete_delay,
            None,
            on_done=lambda: self._nodes.pop(key, None),
        )

    def _update(
        self, project: str, zone: str, name: str, query: dict[str, list[str]], body: dict[str, Any]
    ) -> dict[str, Any]:
        node = self._find(zone, name, project)
        mask = query.get("updateMask", [""])[0]
        paths = [p for p in mask.split(",") if p]
        if not paths:
            raise ApiError("INVALID_ARGUMENT", "updateMask is required")
        changes: dict[str, Any] = {}
        for path in paths:
            if path not in ("metadata", "labels", "description", "tags"):
                raise ApiError("INVALID_ARGUMENT", f"field {path!r} cannot be updated")
            changes[path] = body.get(path, {} if path in ("metadata", "labels") else "")
        _check_labels(changes.get("labels"))

        def apply() -> None:
            node.body.update(changes)

        return self._new_operation(project, zone, "update", node.path, self.update_delay, None, on_done=apply)

    def _guest_attributes(self, project: str, zone: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        node = self._find(zone, name, project)
        query_path = body.get("queryPath", "")
        wanted = [int(w) for w in body.get("workerIds", [])] or list(range(len(node.host_keys)))
        attributes = []
        for worker in wanted:
            items = []
            if node.body["state"] == "READY" and query_path in ("", "hostkeys/"):
                for line in node.host_keys[worker]:
                    kind, blob = line.split()[:2]
                    items.append({"namespace": "hostkeys", "key": kind, "value": blob})
            attributes.append({"queryPath": query_path, "queryValue": {"items": items}})
        return {"guestAttributes": attributes}

    def _import_ssh_key(self, user: str, body: dict[str, Any], query: dict[str, list[str]]) -> dict[str, Any]:
        self._check_injected("oslogin", "-")
        self.oslogin_keys.setdefault(user, []).append(body["key"])
        username = re.sub(r"[^a-z0-9_]", "_", user.lower())
        return {
            "loginProfile": {
                "name": user,
                "posixAccounts": [
                    {
                        "primary": True,
                        "username": username,
                        "uid": "1001",
                        "gid": "1001",
                        "homeDirectory": f"/home/{username}",
                        "operatingSystemType": "LINUX",
                    }
                ],
            }
        }

    def _new_operation(
        self,
        project: str,
        zone: str,
        verb: str,
        target: str,
        delay: float,
        error: ApiError | None,
        on_done: Any = None,
    ) -> dict[str, Any]:
        name = f"projects/{project}/locations/{zone}/operations/operation-{next(self._ids)}-{verb}"
        self._operations[name] = _Operation(
            name, verb, target, _rfc3339(time.time()), time.monotonic() + delay, error, on_done
        )
        return self._operation_json(name)

    def _operation_json(self, name: str) -> dict[str, Any]:
        op = self._operations.get(name)
        if op is None:
            raise ApiError("NOT_FOUND", f"Operation {name} not found")
        result: dict[str, Any] = {
            "name": op.name,
            "metadata": {
                "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                "createTime": op.created,
                "target": op.target,
                "verb": op.verb,
                "apiVersion": "v2",
            },
            "done": op.finished,
        }
        if op.finished:
            if op.error is not None:
                result["error"] = op.error.rpc_status()
            else:
                result["response"] = {"@type": "type.googleapis.com/google.protobuf.Empty"}
        return result

    def _advance(self) -> None:
        """Apply every state change whose time has come (called on each request; no background thread)."""
        now = time.monotonic()
        for node in self._nodes.values():
            if node.ready_at is not None and now >= node.ready_at and node.body["state"] == "CREATING":
                node.body["state"] = "READY"
                node.body["health"] = "HEALTHY"
                node.ready_at = None
        for op in self._operations.values():
            if not op.finished and now >= op.done_at:
                if op.verb == "create" and op.error is None:
                    node = next((n for n in self._nodes.values() if n.path == op.target), None)
                    if node is not None and node.body["state"] == "CREATING":
                        continue  # a create completes when its node is READY
                op.finished = True
                if op.on_done is not None:
                    op.on_done()


class _Handler(BaseHTTPRequestHandler):
    api: TpuApiEmulator
    protocol_version = "HTTP/1.1"

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
            payload, status = self.api.handle(method, url.path, parse_qs(url.query), body), 200
        except ApiError as exc:
            payload, status = exc.body(), exc.http
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        if os.environ.get("TPU_API_EMULATOR_LOG"):
            super().log_message(format, *args)


def _check_multislice(spec: dict[str, Any], alpha: bool) -> None:
    """A node spec with a node count: v4 and later only, more than one node, no nodeId beside it."""
    params = spec.get("multiNodeParams" if alpha else "multisliceParams")
    if params is None:
        if not spec.get("nodeId"):
            raise ApiError("INVALID_ARGUMENT", "tpu.nodeSpec needs a nodeId, or multisliceParams.")
        return
    if spec.get("nodeId"):
        raise ApiError("INVALID_ARGUMENT", "nodeId must be empty when multisliceParams is set.")
    if int(params.get("nodeCount", 0)) < 2:
        raise ApiError("INVALID_ARGUMENT", "multisliceParams.nodeCount needs to be > 1.")
    if (prefix := params.get("nodeIdPrefix")) and not _PREFIX.match(prefix):
        raise ApiError("INVALID_ARGUMENT", f"Invalid multisliceParams.nodeIdPrefix '{prefix}'.")
    family = spec["node"]["acceleratorType"].split("-")[0]
    if family in ("v2", "v3"):
        raise ApiError("INVALID_ARGUMENT", f"Multislice is not supported for accelerator type "
                       f"{spec['node']['acceleratorType']}.")


def _version_view(body: dict[str, Any], alpha: bool) -> dict[str, Any]:
    """A resource as one API version shows it: v2 lacks the alpha-only fields."""
    if alpha:
        return body
    return {k: v for k, v in body.items() if k not in ("upcomingMaintenance", "bestEffort")}


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def main() -> None:
    parser = argparse.ArgumentParser(description="Cloud TPU v2 REST API emulator on 127.0.0.1")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--create-delay", type=float, default=20.0, help="seconds a node stays CREATING")
    parser.add_argument("--delete-delay", type=float, default=5.0, help="seconds a node stays DELETING")
    parser.add_argument(
        "--stockout", action="append", default=[], metavar="ZONE", help="zone without capacity"
    )
    parser.add_argument("--quota", action="append", default=[], metavar="ZONE", help="zone over quota")
    parser.add_argument("--queue-delay", type=float, default=5.0,
                        help="seconds each queued-request state lasts, capacity permitting")
    parser.add_argument("--capacity-after", action="append", default=[], metavar="ZONE=S",
                        help="queued requests in ZONE get capacity only after S seconds")
    parser.add_argument("--demo", action="store_true", help="start with nodes in project 'demo'")
    args = parser.parse_args()
    api = TpuApiEmulator(create_delay=args.create_delay, delete_delay=args.delete_delay, update_delay=0.5,
                         queue_delay=args.queue_delay)
    for item in args.capacity_after:
        zone, _, seconds = item.partition("=")
        api.capacity_after(zone, float(seconds))
    for zone in args.stockout:
        api.stockout(zone)
    for zone in args.quota:
        api.quota_exceeded(zone)
    if args.demo:
        api.add_node("demo", "europe-west4-a", "demo-v6e-8", "v6e-8")
        api.add_node("demo", "us-east5-b", "demo-v6e-16", "v6e-16")
        api.add_node(
            "demo", "us-central2-b", "demo-v4-16", "v4-16", spot=False, runtime_version="tpu-ubuntu2204-base"
        )
        api.preempt("us-east5-b", "demo-v6e-16", "Spot capacity was reclaimed.")
        api.add_multislice("demo", "europe-west4-a", "demo-ms", "v6e-16", 2)  # one node of 2 slices in ls
    endpoint = api.start(args.port)
    print(f"TPU API emulator on {endpoint} (Ctrl-C stops it)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        api.stop()


if __name__ == "__main__":
    main()
