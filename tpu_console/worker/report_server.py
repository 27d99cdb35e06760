"""The run's supervisor (supervisor.py) as the job runners reach it: an HTTP server on the pod's network
(127.0.0.1 on a local pod, worker 0's internal address on a TPU VM) on a port of the system's choosing.

Each runner POSTs one JSON report (job_runner.py: `start`, `heartbeat`, `exit`, `notice`, `poll`) with the
run's token from supervision.json; the answer is the supervisor's order as JSON. A body that is not JSON
gets 400, a wrong token 403. Once listening, the server writes `supervisor.pid` and then `supervisor.port`
(tmp + rename), which `launch` waits for (fleet/run_recipes.py, start_supervisor).

Python 3.8+ and the standard library only: shipped into the run folder beside supervisor.py.
"""

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT_FILE = "supervisor.port"
PID_FILE = "supervisor.pid"


def serve(folder, report, token, bind):
    """Serve in a thread of its own, each report answered with `report(message)`; the server (to
    `shutdown`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            try:
                length = int(self.headers.get("Content-Length", "0"))
                message = json.loads(self.rfile.read(length).decode())
            except ValueError:
                return self._answer(400, {"error": "not JSON"})
            if message.get("token") != token:
                return self._answer(403, {"error": "wrong token"})
            return self._answer(200, report(message))

        def _answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # noqa: A002 - quiet: the decisions file is the record
            pass

    server = ThreadingHTTPServer((bind, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    with open(os.path.join(folder, PID_FILE), "w") as out:
        out.write(f"{os.getpid()}\n")
    with open(os.path.join(folder, PORT_FILE + ".tmp"), "w") as out:
        out.write(f"{port}\n")
    os.replace(os.path.join(folder, PORT_FILE + ".tmp"), os.path.join(folder, PORT_FILE))
    return server
