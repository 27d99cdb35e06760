"""A fake Compute Engine metadata server on 127.0.0.1 for a VM's preemption notice: `instance/preempted` and
`instance/maintenance-event` with their ETags, answered at once or, with `?wait_for_change=true` and the
last ETag, when the value changes (or `timeout_sec` passes), as the real one does. Only requests with the
header Metadata-Flavor: Google are answered. `flip` changes a key; `asked` keeps every request's path."""

from __future__ import annotations

import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PREFIX = "/computeMetadata/v1/"


class FakeMetadata:
    def __init__(self, preempted: str = "FALSE", maintenance: str = "NONE") -> None:
        self.values = {"instance/preempted": preempted, "instance/maintenance-event": maintenance}
        self.etags = dict.fromkeys(self.values, 1)
        self.changed = threading.Condition()
        self.asked: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                fake.asked.append(self.path)
                url = urllib.parse.urlparse(self.path)
                key = url.path[len(PREFIX):]
                if self.headers.get("Metadata-Flavor") != "Google" or key not in fake.values:
                    self.send_response(403 if key in fake.values else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                query = urllib.parse.parse_qs(url.query)
                if query.get("wait_for_change") == ["true"]:
                    last = query.get("last_etag", [""])[0]
                    wait = float(query.get("timeout_sec", ["60"])[0])
                    with fake.changed:
                        fake.changed.wait_for(lambda: str(fake.etags[key]) != last, timeout=wait)
                with fake.changed:
                    body, etag = fake.values[key].encode(), str(fake.etags[key])
                try:
                    self.send_response(200)
                    self.send_header("ETag", etag)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the watcher went (its job ended) while it waited

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.host = f"127.0.0.1:{self.server.server_address[1]}"  # as GCE_METADATA_HOST names it
        self.base = f"http://{self.host}{PREFIX}"

    def flip(self, key: str, value: str) -> None:
        with self.changed:
            self.values[key] = value
            self.etags[key] += 1
            self.changed.notify_all()

    def close(self) -> None:
        with self.changed:  # wake the waits so the server can stop
            for key in self.etags:
                self.etags[key] += 1
            self.changed.notify_all()
        self.server.shutdown()
        self.server.server_close()
