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
    """The process group of the check started on that worker after `after` (its pid file), or None yet."""
    for pid_file in sorted((worker_dir / DOCTOR_DIR).glob("*/pid")):
        with contextlib.suppress(OSError, ValueError):
            if pid_file.stat().st_mtime >= after and pid_file.read_text().strip():
                return int(pid_file.read_text())
    return None


class StopInBursts:
    """A thread that SIGSTOPs the check's process group on one worker for `stopped_s` out of every
    `stopped_s + running_s`, from when it starts until `stop()` (then SIGCONT)."""

    def __init__(self, worker_dir: Path, stopped_s: float = 0.4, running_s: float = 0.1) -> None:
        self.worker_dir, self.stopped_s, self.running_s = worker_dir, stopped_s, running_s
        self._done = threading.Event()
        self._since = time.time() - 1
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StopInBursts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        group = None
        while group is None and not self._done.wait(0.05):
            group = check_group(self.worker_dir, self._since)
        while group is not None and not self._done.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGSTOP)
            self._done.wait(self.stopped_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGCONT)
            self._done.wait(self.running_s)
