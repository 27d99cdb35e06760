"""A pre-started bash per worker server, so a command does not wait for a process to be created.

Starting a process costs more than anything else in a local command: on a 2-core machine, 64 `bash`
processes started at once take about 130 ms, more than the whole fan-out budget. So, like a pre-forking
server, each worker server keeps one bash already started (new session, worker folder as cwd, the
worker's environment, its stdin/stdout/stderr pipes on the event loop), blocked reading a command from
an extra pipe. A command hands its text to that bash, which runs it with `eval` and exits with its
status; the server then starts the next spare in the background, off the command's path.

Each spare runs exactly one command and exits, so commands share no shell state: it is a fresh bash
each time, as with `bash -c`. The differences are invisible to ordinary commands: `$-` lacks `c`,
`BASH_EXECUTION_STRING` is the loader (worker/agent.py), and a syntax error names `eval` instead of `-c`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from tpu_console.providers.local.child_process import ChildProcess, start_child
from tpu_console.worker.agent import REFILL_DELAY_S, SPARE_MAX_COMMAND_BYTES, spare_loader

# The spares are the worker agent's (worker/agent.py), with its limits and its loader: longer commands are
# started the usual way (`bash -c`), as the text must go to the spare's pipe in one non-blocking write; the
# next spare starts REFILL_DELAY_S after a command ends, or once a long command has run LONG_COMMAND_S.


class _Spare:
    def __init__(self, child: ChildProcess, command_fd: int) -> None:
        self.child = child
        self.command_fd = command_fd  # the write end of the command pipe

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.command_fd)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.child.pid, signal.SIGKILL)


class SpareShells:
    """Keeps one started bash ready for the next command of one worker."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self._cwd = cwd
        self._env = env
        self._spare: _Spare | None = None
        self._refill: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        """Start making a spare in the background (no-op if one is ready or on its way)."""
        if self._closed or self._spare is not None or (self._refill and not self._refill.done()):
            return
        self._refill = asyncio.get_running_loop().create_task(self._make())

    async def wait_ready(self) -> bool:
        """Wait for the spare on its way, if any; True when one is ready."""
        if self._refill is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._refill)
        return self._spare is not None

    def start_later(self, delay: float = REFILL_DELAY_S) -> None:
        """Start the next spare after `delay`: not at once, as 64 workers' new shells would compete for
        the CPU with the rest of a fan-out. No-op if one is ready or on its way by then."""
        if not self._closed:
            asyncio.get_running_loop().call_later(delay, self.start)

    def run(self, command: str) -> ChildProcess | None:
        """Hand `command` to the ready spare and return it as the command's process, or None when no
        spare is ready (the caller then starts one itself). The caller calls `start_later` after."""
        spare, self._spare = self._spare, None
        data = command.encode("utf-8", errors="surrogateescape") + b"\0"
        if spare is None:
            return None
        if spare.child.exited.done() or len(data) > SPARE_MAX_COMMAND_BYTES or b"\0" in data[:-1]:
            spare.discard()
            return None
        try:
            written = os.write(spare.command_fd, data)
        except OSError:
            written = -1
        os.close(spare.command_fd)
        if written != len(data):  # the spare died under us; it never saw a whole command
            spare.discard()
            return None
        return spare.child

    async def close(self) -> None:
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refill
        if self._spare is not None:
            self._spare.discard()
            self._spare = None

    async def _make(self) -> None:
        read_fd, write_fd = os.pipe()
        try:
            argv = ["bash", "-c", spare_loader(read_fd)]
            child = await start_child(argv, self._cwd, self._env, pass_fds=(read_fd,))
        except OSError:
            os.close(write_fd)  # no spare this time: commands start bash themselves, as they report
            return
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        spare = _Spare(child, write_fd)
        if self._closed:
            spare.discard()
        else:
            self._spare = spare
