"""A Compute Engine v1 REST API emulator, served over plain HTTP on 127.0.0.1, for tests.

It speaks the part of the REST surface `google.cloud.compute_v1.InstancesClient(transport="rest")` and
`ZoneOperationsClient` use for one small VM: instances get, insert, start, stop, delete, and zone
operations get. Every call that changes an instance answers a zone operation that is RUNNING on its
first read and DONE on the next, and the instance moves as the real one does: PROVISIONING, STAGING,
RUNNING (one state per read), TERMINATED after a stop, gone after a delete. A running instance's first
network interface has a one-to-one NAT access config whose `natIP` is `nat_ip` (127.0.0.1 by default, so a
test's sshd stands for the VM's). `fail_next(method, status)` makes the next call of a method answer an
HTTP error; `requests` records every (method, path).

It shares no code with tpu_console, so a wrong assumption in the console cannot hide behind the same one
here.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from tests.local_http_api import LocalHttpApi

INSTANCE = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances"
                      r"(?:/([^/:]+))?(?:/(start|stop))?$")
OPERATION = re.compile(r"^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)(?:/wait)?$")
BOOTING = ("PROVISIONING", "STAGING", "RUNNING")


class ComputeApiEmulator(LocalHttpApi):
    def __init__(self, nat_ip: str = "127.0.0.1") -> None:
        self.nat_ip = nat_ip
        self.instances: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._failures: list[list[Any]] = []  # [method, status, remaining]
        self._booting: dict[tuple[str, str, str], list[str]] = {}  # states still to show, one per read
        self._ids = itertools.count(4_000_000_000_000_000_001)
        self._lock = threading.Lock()

    def start(self) -> str:
        return self._serve(_Handler)

    def fail_next(self, method: str, status: int, times: int = 1) -> None:
        """The next `times` calls of `method` (get, insert, start, stop, delete, operation) answer
        `status`."""
        self._failures.append([method, status, times])

    # ---- the API ---------------------------------------------------------------------------------------

    def handle(self, verb: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        self.requests.append((verb, path))
        if match := OPERATION.match(path):
            return self._injected("operation") or self._operation(match.group(3))
        match = INSTANCE.match(path)
        if not match:
            return 404, _error(404, f"no such path {path}")
        project, zone, name, action = match.groups()
        if verb == "POST" and name is None:
            return self._injected("insert") or self._insert(project, zone, body)
        if name is None:
            return 404, _error(404, "listing is not emulated")
        key = (project, zone, name)
        method = action or {"GET": "get", "DELETE": "delete"}.get(verb, "?")
        if failed := self._injected(method):
            return failed
        with self._lock:
            instance = self.instances.get(key)
            if instance is None:
                return 404, _error(404, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                                        "was not found")
            if method == "get":
                self._advance(key, instance)
                return 200, instance
            if method == "delete":
                del self.instances[key]
                self._booting.pop(key, None)
            elif method == "stop":
                instance["status"] = "TERMINATED"
                instance["networkInterfaces"][0]["accessConfigs"][0].pop("natIP", None)
            elif method == "start" and instance["status"] == "TERMINATED":
                instance["status"] = "STAGING"
                self._booting[key] = ["RUNNING"]
            return 200, self._new_operation(project, zone, name, method)

    def _insert(self, project: str, zone: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body.get("name", "")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            return 400, _error(400, f"Invalid value for field 'resource.name': '{name}'")
        if not body.get("disks") or not body.get("networkInterfaces"):
            return 400, _error(400, "an instance needs a boot disk and a network interface")
        with self._lock:
            key = (project, zone, name)
            if key in self.instances:
                return 409, _error(409, f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                                        "already exists")
            instance = {
                **body, "kind": "compute#instance", "id": str(next(self._ids)), "status": "PROVISIONING",
                "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
                "selfLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/"
                            f"instances/{name}",
            }
            instance["networkInterfaces"] = [
                {**nic, "networkIP": f"10.128.0.{i + 2}", "accessConfigs": [dict(c) for c in
                                                                              nic.get("accessConfigs", [])]}
                for i, nic in enumerate(body["networkInterfaces"])]
            self.instances[key] = instance
            self._booting[key] = list(BOOTING[1:])
            return 200, self._new_operation(project, zone, name, "insert")

    def _advance(self, key: tuple[str, str, str], instance: dict[str, Any]) -> None:
        if self._booting.get(key):
            instance["status"] = self._booting[key].pop(0)
        if instance["status"] == "RUNNING":
            for config in instance["networkInterfaces"][0]["accessConfigs"]:
                config.setdefault("natIP", self.nat_ip)

    def _new_operation(self, project: str, zone: str, name: str, kind: str) -> dict[str, Any]:
        op_id = str(next(self._ids))
        operation = {
            "kind": "compute#operation", "id": op_id, "name": f"operation-{op_id}", "operationType": kind,
            "status": "RUNNING", "progress": 0,
            "zone": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}",
            "targetLink": f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/instances/"
                          f"{name}",
        }
        self.operations[operation["name"]] = operation
        return dict(operation)

    def _operation(self, name: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            operation = self.operations.get(name)
            if operation is None:
                return 404, _error(404, f"no operation {name}")
            answer = dict(operation)
            operation.update(status="DONE", progress=100)  # RUNNING on its first read, DONE after
            return 200, answer

    def _injected(self, method: str) -> tuple[int, dict[str, Any]] | None:
        with self._lock:
            for entry in self._failures:
                if entry[0] == method and entry[2] > 0:
                    entry[2] -= 1
                    return entry[1], _error(entry[1], f"injected failure of {method}")
        return None


def _error(code: int, message: str) -> dict[str, Any]:
    errors = [{"message": message, "reason": "emulated"}]
    return {"error": {"code": code, "message": message, "errors": errors}}


class _Handler(BaseHTTPRequestHandler):
    api: ComputeApiEmulator

    def log_message(self, *_args: Any) -> None:
        pass

    def _serve(self, verb: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        status, answer = self.api.handle(verb, urlsplit(self.path).path, body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")
