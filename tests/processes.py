"""Small helpers for tests that watch real processes: wait for a condition, tell whether a pid still runs."""

from __future__ import annotations

import os
import time
from pathlib import Path


def wait_for(predicate, timeout: float = 15.0, poll: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(poll)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a killed child not yet reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False  # gone since kill(0) (read fails with ESRCH once it has gone), or no /proc here
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
