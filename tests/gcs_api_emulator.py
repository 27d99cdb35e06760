"""A Cloud Storage JSON API emulator on 127.0.0.1 that honours generation preconditions, for tests.

It serves what google-cloud-storage asks of it for objects in any bucket: metadata get, media download,
multipart and simple media upload, list with a prefix, delete; every one of them with `ifGenerationMatch`
(0: the object must not exist) answered 412 when it does not hold, as the real service does. Each write
makes a new generation. `fail_next(method, status, times)` injects errors; `delay_next(method, seconds)`
a slow answer. gcp-storage-emulator (used for the run records) ignores preconditions, so the controller's
compare-and-swap is tested here.

It shares no code with tpu_console, so a wrong assumption in the store cannot hide behind the same one here.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from tests.local_http_api import LocalHttpApi


class GcsApiEmulator(LocalHttpApi):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.objects: dict[tuple[str, str], tuple[bytes, int, str]] = {}  # (bucket, name): (data, gen, type)
        self._generations = itertools.count(1_700_000_000_000_001)
        self._failures: list[list[Any]] = []  # [method, status, remaining]
        self._delays: list[list[Any]] = []  # [method, seconds, remaining]
        self.calls: list[tuple[str, str]] = []

    def start(self) -> str:
        return self._serve(_Handler)

    def fail_next(self, method: str, status: int, times: int = 1) -> None:
        """The next `times` calls of `method` (get, download, upload, list, delete) answer HTTP `status`."""
        self._failures.append([method, status, times])

    def delay_next(self, method: str, seconds: float, times: int = 1) -> None:
        self._delays.append([method, seconds, times])

    def _injected(self, method: str) -> int | None:
        with self._lock:
            for entry in self._delays:
                if entry[0] == method and entry[2] > 0:
                    entry[2] -= 1
                    delay = entry[1]
                    break
            else:
                delay = 0.0
            status = None
            for entry in self._failures:
                if entry[0] == method and entry[2] > 0:
                    entry[2] -= 1
                    status = entry[1]
                    break
        if delay:
            time.sleep(delay)
        return status

    def _resource(self, bucket: str, name: str, data: bytes, generation: int, content_type: str) -> dict:
        return {"kind": "storage#object", "bucket": bucket, "name": name,
                "id": f"{bucket}/{name}/{generation}",
                "generation": str(generation), "metageneration": "1", "size": str(len(data)),
                "contentType": content_type, "md5Hash": "", "updated": "2026-01-01T00:00:00.000Z"}

    def _precondition(self, key: tuple[str, str], query: dict[str, list[str]]) -> None:
        wanted = query.get("ifGenerationMatch")
        if wanted is None:
            return
        current = self.objects.get(key)
        if int(wanted[0]) != (current[1] if current else 0):
            raise _HttpError(412, "At least one of the pre-conditions you specified did not hold.")

    def handle(self, verb: str, path: str, query: dict[str, list[str]], headers: Any, body: bytes
               ) -> tuple[int, bytes, dict[str, str]]:
        parts = path.split("/")
        try:
            if path.startswith("/upload/storage/v1/b/") and verb == "POST":
                return self._upload(unquote(parts[5]), query, headers, body)
            if path.startswith("/download/storage/v1/b/") and verb == "GET":
                return self._download(unquote(parts[5]), unquote("/".join(parts[7:])), query)
            if path.startswith("/storage/v1/b/") and len(parts) == 6 and parts[5] == "o" and verb == "GET":
                return self._list(unquote(parts[4]), query)
            if path.startswith("/storage/v1/b/") and len(parts) >= 7:
                bucket, name = unquote(parts[4]), unquote("/".join(parts[6:]))
                if verb == "GET" and query.get("alt") == ["media"]:
                    return self._download(bucket, name, query)
                if verb == "GET":
                    return self._get(bucket, name, query)
                if verb == "DELETE":
                    return self._delete(bucket, name, query)
            raise _HttpError(404, f"no such call: {verb} {path}")
        except _HttpError as exc:
            error = {"error": {"code": exc.status, "message": exc.message}}
            return exc.status, json.dumps(error).encode(), {}

    def _fail(self, method: str) -> None:
        self.calls.append((method, ""))
        status = self._injected(method)
        if status is not None:
            raise _HttpError(status, f"injected {status} on {method}")

    def _upload(self, bucket: str, query: dict[str, list[str]], headers: Any, body: bytes):
        self._fail("upload")
        kind = query.get("uploadType", ["media"])[0]
        if kind == "multipart":
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + headers["Content-Type"].encode() + b"\r\n\r\n" + body)
            meta_part, data_part = list(message.iter_parts())[:2]
            meta = json.loads(meta_part.get_payload(decode=True))
            data = data_part.get_payload(decode=True)
            name, content_type = meta["name"], meta.get("contentType") or data_part.get_content_type()
        elif kind == "media":
            name, data, content_type = query["name"][0], body, headers.get("Content-Type", "")
        else:
            raise _HttpError(400, f"uploadType {kind} is not emulated")
        with self._lock:
            key = (bucket, name)
            self._precondition(key, query)
            generation = next(self._generations)
            self.objects[key] = (data, generation, content_type)
            return 200, json.dumps(self._resource(bucket, name, data, generation, content_type)).encode(), {}

    def _get(self, bucket: str, name: str, query: dict[str, list[str]]):
        self._fail("get")
        with self._lock:
            found = self.objects.get((bucket, name))
            if found is None:
                raise _HttpError(404, f"No such object: {bucket}/{name}")
            self._precondition((bucket, name), query)
            return 200, json.dumps(self._resource(bucket, name, *found)).encode(), {}

    def _download(self, bucket: str, name: str, query: dict[str, list[str]]):
        self._fail("download")
        with self._lock:
            found = self.objects.get((bucket, name))
            if found is None:
                raise _HttpError(404, f"No such object: {bucket}/{name}")
            self._precondition((bucket, name), query)
            if "generation" in query and int(query["generation"][0]) != found[1]:
                raise _HttpError(404, f"No such object generation: {bucket}/{name}")
            data, generation, content_type = found
            md5 = hashlib.md5(data).digest()  # noqa: S324 - the checksum the client checks, as GCS sends it
            return 200, data, {"x-goog-generation": str(generation), "Content-Type": content_type,
                               "x-goog-hash": f"md5={base64.b64encode(md5).decode()}"}

    def _list(self, bucket: str, query: dict[str, list[str]]):
        self._fail("list")
        prefix = query.get("prefix", [""])[0]
        with self._lock:
            items = [self._resource(b, n, *v) for (b, n), v in sorted(self.objects.items())
                     if b == bucket and n.startswith(prefix)]
        return 200, json.dumps({"kind": "storage#objects", "items": items}).encode(), {}

    def _delete(self, bucket: str, name: str, query: dict[str, list[str]]):
        self._fail("delete")
        with self._lock:
            if (bucket, name) not in self.objects:
                raise _HttpError(404, f"No such object: {bucket}/{name}")
            self._precondition((bucket, name), query)
            del self.objects[(bucket, name)]
        return 204, b"", {}


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class _Handler(BaseHTTPRequestHandler):
    api: GcsApiEmulator
    protocol_version = "HTTP/1.1"

    def _serve(self, verb: str) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, payload, headers = self.api.handle(verb, url.path, parse_qs(url.query), self.headers, body)
        try:
            self._answer(status, payload, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up waiting (a delayed answer): as the real service, nothing to do

    def _answer(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        headers.setdefault("Content-Type", "application/json")
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if payload:
            self.wfile.write(payload)

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._serve("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._serve("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._serve("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass
