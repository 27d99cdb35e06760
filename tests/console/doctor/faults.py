"""Faults put into a local pod for the doctor to find (its tests and benchmarks/doctor.py): a host that
exposes fewer CPU devices than its peers, a host stopped in bursts, and a coordinator address no worker
reaches (a firewall that drops the packets). The chip that answers wrong and the worker that never enters a
collective are the check program's own test hook (TPU_CONSOLE_DOCTOR_FAULT)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

from tpu_console.doctor.check import DOCTOR_DIR
from tpu_console.providers.local import LocalProvider

UNROUTED = "192.0.2.1"  # TEST-NET-1: never routed, so a connection there times out as a dropped one does


async def expose_devices(provider: LocalProvider, node: str, worker: int, devices: int) -> None:
    """Restart `worker`'s SSH server on its port with `devices` CPU devices in its environment."""
    server = provider.worker_server(node, worker)
    port = server.port
    await server.close()
    server.spec = replace(server.spec, devices=devices)
    server._env = server.spec.environment()  # what its commands start with
    for _ in range(50):  # a connection of the old server's may hold the port a moment longer
        try:
            await server.start(port)
            return
        except OSError:
            await asyncio.sleep(0.1)
    await server.start(port)


def block_coordinator(provider: LocalProvider, port: int) -> None:
    """The pod's jobs are told a coordinator address their workers cannot reach."""
    provider.coordinator_env = lambda node, targets: {  # type: ignore[method-assign]
        "TRAINER_COORDINATOR_ADDRESS": f"{UNROUTED}:{port}", "TRAINER_NUM_PROCESSES": str(len(targets))}


def check_group(worker_dir: Path, after: float) -> int | None:
    """The process group of the newest check started on that worker after `after` (its pid file), or None
    yet."""
    newest: tuple[float, int] | None = None
    for pid_file in (worker_dir / DOCTOR_DIR).glob("*/pid"):
        with contextlib.suppress(OSError, ValueError):
            mtime = pid_file.stat().st_mtime
            if mtime >= after and (newest is None or mtime > newest[0]):
                newest = (mtime, int(pid_file.read_text()))
    return newest[1] if newest else None


def group_members(group: int) -> list[int]:
    """The live processes of a process group (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if _stat_fields(int(entry))[2] == group:  # pgrp
                    members.append(int(entry))
    return members


def _stat_fields(pid: int) -> list[int]:
    """/proc/PID/stat's numeric fields after the command name: [state, ppid, pgrp, ...] (state as 0), so
    field n of proc(5) is at n - 3."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return [0] + [int(v) for v in text[text.rindex(")") + 2:].split()[1:]]


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used so far (the gone ones count nothing)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = _stat_fields(pid)
            ticks += fields[11] + fields[12]  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def has_joined(pids: list[int]) -> bool:
    """Whether any of the processes holds a socket: the check's only sockets are the pod's coordination
    service's, opened when it joins (jax.distributed.initialize)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                        return True
    return False


class StopInBursts:
    """A thread that throttles the check on one worker, as an overcommitted host is throttled: from when the
    check has joined its pod, it lets the check's process group run for `quantum_s` of CPU time, then
    SIGSTOPs it for `stopped_s`, over and over until the `with` block ends (then SIGCONT).

    Quanta of CPU time, not of wall time: under load the thread wakes late, and a wall-clock window would
    hand the check however much CPU it got meanwhile (a loaded CI machine's check once slipped through
    with one stop). Counted in CPU, the check's 0.1-0.2 s of own work is always several stops.
    From the join, not the start: the import of JAX, throttled, would take minutes."""

    def __init__(self, worker_dir: Path, stopped_s: float = 0.6, quantum_s: float = 0.02) -> None:
        self.worker_dir, self.stopped_s, self.quantum_s = worker_dir, stopped_s, quantum_s
        self._done = threading.Event()
        self._since = time.time() - 0.05  # a pid file's mtime may be stamped a tick early
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StopInBursts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        group = None
        while group is None and not self._done.wait(0.02):
            group = check_group(self.worker_dir, self._since)
        members: list[int] = []
        while group is not None and not has_joined(members) and not self._done.wait(0.01):
            members = group_members(group)
        while members and not self._done.is_set():
            used = cpu_seconds(members)
            while cpu_seconds(members) - used < self.quantum_s and not self._done.wait(0.002):
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGSTOP)
            self._done.wait(self.stopped_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
            members = [pid for pid in members if Path(f"/proc/{pid}").exists()]
