"""The VM's notice that it is going away, read on every worker so the job can checkpoint before it goes.

A spot or preemptible VM learns it is being taken from the Compute Engine metadata server: the key
`instance/preempted` turns TRUE about 30 s before the VM is stopped, and `instance/maintenance-event`
names TERMINATE_ON_HOST_MAINTENANCE about 60 s before host maintenance stops it (MIGRATE_ON_HOST_MAINTENANCE
is a live migration: the VM stays, so it is no notice). The VM's own shutdown also reaches every process
as SIGTERM (systemd stopping the session); `system_going_down` tells that SIGTERM from a `tpu-console stop`.

`NoticeWatch` long-polls both keys (`?wait_for_change=true` with the last ETag, header Metadata-Flavor:
Google) in threads of their own and calls `on_notice` with a `Notice` the first time either says the VM
goes. The server is `$GCE_METADATA_HOST` (host[:port], the name Google's client libraries read too) or
metadata.google.internal; tests run a fake one on 127.0.0.1.

What the job is given (docs/contract.md): SIGTERM, and the notice as JSON in the file named by
`TPU_CONSOLE_PREEMPTION_FILE` (set when the job starts; a variable cannot change in a running process),
whose `deadline` is the unix time the VM is expected to stop.

Python 3.8+ and the standard library only: shipped into the run folder beside job_runner.py.
"""

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

METADATA_HOST_ENV = "GCE_METADATA_HOST"
METADATA_HOST = "metadata.google.internal"
PREEMPTION_FILE_ENV = "TPU_CONSOLE_PREEMPTION_FILE"
PREEMPTION_FILE = "preemption.json"
PREEMPTED_KEY = "instance/preempted"
MAINTENANCE_KEY = "instance/maintenance-event"
# Seconds from the notice to the VM's stop, as Compute Engine documents them.
SECONDS_LEFT = {"preempted": 30.0, "maintenance": 60.0, "shutdown": 30.0}
POLL_TIMEOUT_S = 600.0  # a wait_for_change answers by itself when nothing changed for a while
RETRY_S = (1.0, 2.0, 5.0, 10.0)  # after a failed read: no metadata server (yet), or it blinked


class Notice:
    """One notice: where it came from (preempted, maintenance, shutdown), the value read, when it was
    seen and when the VM is expected to stop."""

    def __init__(self, source, value, seen_at=None, deadline=None, worker=None):
        self.source = source
        self.value = value
        self.seen_at = time.time() if seen_at is None else float(seen_at)
        self.deadline = self.seen_at + SECONDS_LEFT.get(source, 30.0) if deadline is None else float(deadline)
        self.worker = worker  # the worker that saw it, when passed on by the supervisor

    def seconds_left(self, now=None):
        return max(0.0, self.deadline - (time.time() if now is None else now))

    def to_json(self):
        data = {"source": self.source, "value": self.value, "seen_at": round(self.seen_at, 3),
                "deadline": round(self.deadline, 3), "seconds_left": round(self.seconds_left(), 1)}
        if self.worker is not None:
            data["worker"] = self.worker
        return data

    @classmethod
    def from_json(cls, data):
        return cls(data.get("source", "preempted"), data.get("value"), data.get("seen_at"),
                   data.get("deadline"), data.get("worker"))

    def describe(self):
        what = {"preempted": "the VM is preempted", "maintenance": f"host maintenance ({self.value})",
                "shutdown": "the VM is shutting down"}.get(self.source, self.source)
        return f"{what}: {self.seconds_left():.0f}s left"

    def write(self, path):
        """The notice as the job reads it, written whole (tmp + rename)."""
        with open(path + ".tmp", "w") as out:
            json.dump(self.to_json(), out)
        os.replace(path + ".tmp", path)


def notice_of(key, value):
    """The Notice a metadata key's value means, or None (FALSE, NONE, a live migration)."""
    value = (value or "").strip()
    if key == PREEMPTED_KEY and value.upper() == "TRUE":
        return Notice("preempted", value)
    if key == MAINTENANCE_KEY and value.upper().startswith("TERMINATE"):
        return Notice("maintenance", value)
    return None


def metadata_base(env=None):
    host = (env if env is not None else os.environ).get(METADATA_HOST_ENV) or METADATA_HOST
    return f"http://{host}/computeMetadata/v1/"


class NoticeWatch:
    """Watches both keys until the first notice, which `on_notice` gets once; `stop()` ends the watch."""

    def __init__(self, on_notice, base=None, poll_timeout_s=POLL_TIMEOUT_S):
        self.on_notice = on_notice
        self.base = base or metadata_base()
        self.poll_timeout_s = poll_timeout_s
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.noticed = False

    def start(self):
        for key in (PREEMPTED_KEY, MAINTENANCE_KEY):
            threading.Thread(target=self._watch, args=(key,), daemon=True).start()
        return self

    def stop(self):
        self.stopped.set()

    def _watch(self, key):
        etag, failures = None, 0
        while not self.stopped.is_set():
            try:
                value, etag = self.read(key, etag)
                failures = 0
            except (OSError, ValueError):
                wait = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                self.stopped.wait(wait)
                continue
            notice = notice_of(key, value)
            if notice is not None:
                with self.lock:
                    first, self.noticed = not self.noticed, True
                if first and not self.stopped.is_set():
                    self.on_notice(notice)
                return

    def read(self, key, etag=None):
        """The key's value and ETag: at once the first time, then when it changes (or the wait ends)."""
        url = self.base + key
        if etag is not None:
            url += f"?wait_for_change=true&last_etag={etag}&timeout_sec={int(self.poll_timeout_s)}"
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=self.poll_timeout_s + 10) as answer:
            return answer.read().decode().strip(), answer.headers.get("ETag") or "0"


def system_going_down():
    """Whether this machine is shutting down (systemd says `stopping`): a SIGTERM then is the VM's own
    end, not a `tpu-console stop`."""
    try:
        said = subprocess.run(["systemctl", "is-system-running"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=2).stdout.decode().strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return said == "stopping"
