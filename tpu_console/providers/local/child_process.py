"""Start a child process with its pipes on the event loop, and learn of its exit without a thread.

asyncio's subprocess support on Python 3.11 starts a watcher thread per child, which costs about as
much as the fork itself: a 64-worker fan-out pays it 64 times. Here the exit is watched through a
pidfd on the event loop (Linux 5.3+); elsewhere one waiting thread per child is the fallback.

The fork/exec itself runs on a small thread pool: it blocks its caller until the child has exec'd,
which on a busy machine takes milliseconds, and 64 of those in a row on the event loop were most of
a fan-out's time. Several threads fork side by side.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

_spawner = ThreadPoolExecutor(max_workers=8, thread_name_prefix="local-worker-spawn")


class OutputPipe(asyncio.Protocol):
    """A child's stdout or stderr on the event loop. What it reads goes straight to the sink attached
    (no reader task in between: a fan-out pays per worker for every step); until one is attached (a
    spare shell waiting for its command), it is kept."""

    def __init__(self) -> None:
        self._transport: asyncio.ReadTransport | None = None
        self._sink: Callable[[bytes], None] | None = None
        self._early: list[bytes] = []
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self._sink is None:
            self._early.append(data)
        else:
            self._sink(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def attach(self, sink: Callable[[bytes], None]) -> None:
        for data in self._early:
            sink(data)
        self._early.clear()
        self._sink = sink

    def pause(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()


@dataclass(eq=False)
class ChildProcess:
    pid: int
    stdin: asyncio.WriteTransport
    stdout: OutputPipe
    stderr: OutputPipe
    exited: asyncio.Future[int]  # the returncode: negative -N when killed by signal N

    async def wait(self) -> int:
        return await asyncio.shield(self.exited)


async def start_child(
    argv: list[str], cwd: Path, env: dict[str, str], pass_fds: tuple[int, ...] = ()
) -> ChildProcess:
    """Start `argv` in a new session (its own process group, so it can be stopped as a whole).
    `pass_fds` are inherited by the child under the same numbers."""
    loop = asyncio.get_running_loop()
    spawn = partial(
        subprocess.Popen,
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
        pass_fds=pass_fds,
        bufsize=0,
    )
    popen = await loop.run_in_executor(_spawner, spawn)
    assert popen.stdin and popen.stdout and popen.stderr
    stdout = OutputPipe()
    stderr = OutputPipe()
    await loop.connect_read_pipe(lambda: stdout, popen.stdout)
    await loop.connect_read_pipe(lambda: stderr, popen.stderr)
    stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, popen.stdin)
    return ChildProcess(popen.pid, stdin, stdout, stderr, _watch_exit(loop, popen))


def _watch_exit(loop: asyncio.AbstractEventLoop, popen: subprocess.Popen) -> asyncio.Future[int]:
    exited: asyncio.Future[int] = loop.create_future()

    def settle(returncode: int) -> None:
        if not exited.done():
            exited.set_result(returncode)

    if hasattr(os, "pidfd_open"):
        pidfd = os.pidfd_open(popen.pid)

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            settle(popen.wait())  # the child has exited: this only reaps it

        loop.add_reader(pidfd, on_exit)
    else:
        threading.Thread(
            target=lambda: loop.call_soon_threadsafe(settle, popen.wait()), daemon=True, name="child-wait"
        ).start()
    return exited
