"""The server half the API emulators share (tests/gcs_api_emulator.py, tests/compute_api_emulator.py): a
threading HTTP server on 127.0.0.1 whose request handler reaches the emulator as `self.api`, for the
client libraries to talk to through their `api_endpoint`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalHttpApi:
    _server: ThreadingHTTPServer | None = None

    def _serve(self, handler: type[BaseHTTPRequestHandler]) -> str:
        bound = type("Handler", (handler,), {"api": self})  # the handler class, reaching this emulator
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), bound)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
