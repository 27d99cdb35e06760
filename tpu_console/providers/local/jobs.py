"""Finding and stopping the detached jobs of a local worker, from the files the launch wrapper leaves.

A job's folder `~/tpu-console/runs/<run_id>/` holds `pid` (the job's process-group id) and, once it has
ended, `exit`. Signals sent over SSH are not a reliable way to stop a job (sshd ignores them for
non-pty sessions, and the job is detached anyway), so stopping means killing the recorded group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def running_job_groups(worker_dir: Path) -> list[int]:
    """Process groups of the jobs under this worker folder that have not written their exit file."""
    groups = []
    for pid_file in sorted((worker_dir / "tpu-console" / "runs").glob("*/pid")):
        if (pid_file.parent / "exit").exists():
            continue
        try:
            pgid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if pgid > 1 and _group_alive(pgid) and _belongs_to(pgid, worker_dir):
            groups.append(pgid)
    return groups


def stop_groups(groups: list[int], grace_s: float = 3.0) -> None:
    """SIGTERM each group, then SIGKILL what is still there after `grace_s`."""
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_group_alive(g) for g in groups):
        time.sleep(0.05)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pgid)


def _is_zombie(pid: int) -> bool:
    """A finished job whose parent never reaps it (PID 1 in some containers) still answers kill(0)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _belongs_to(pgid: int, worker_dir: Path) -> bool:
    """Guard against a recycled pid: where /proc exists, the group leader must run inside the worker
    folder (jobs start in their run folder). Elsewhere, trust the pid file."""
    cwd_link = Path(f"/proc/{pgid}/cwd")
    if not Path("/proc/self").exists():
        return True
    try:
        cwd = Path(os.readlink(cwd_link))
    except OSError:
        return True  # the leader exited but its group lives on; the pid file is all we have
    return cwd == worker_dir.resolve() or worker_dir.resolve() in cwd.parents


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
