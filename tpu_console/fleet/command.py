"""One command on one open SSH connection, as a plain asyncssh session (the exec path): output gathered
(and split into lines for streaming) straight from the channel callbacks, with no reader tasks in
between. The fleet takes this path until a worker's command channel (command_channel.py) is ready, and
where the worker cannot run one."""

from __future__ import annotations

import asyncio
import signal

import asyncssh

from tpu_console.fleet.output import CommandOutcome, CommandOutput, OnLine


class _CommandSession(asyncssh.SSHClientSession[bytes]):
    def __init__(self, worker: int, on_line: OnLine | None, streamed: bool = False) -> None:
        self.output = CommandOutput(worker, on_line, streamed)
        self.exit_status: int | None = None
        self.exit_signal: str | None = None
        self.closed: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self.output.add("stderr" if datatype == asyncssh.EXTENDED_DATA_STDERR else "stdout", data)

    def exit_status_received(self, status: int) -> None:
        self.exit_status = status

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        self.exit_signal = signal

    def connection_lost(self, exc: Exception | None) -> None:
        self.output.end()
        if not self.closed.done():
            self.closed.set_result(exc)

    def status(self) -> int | None:
        if self.exit_signal:  # OpenSSH reports death by signal N apart; use the shell's 128+N
            try:
                return 128 + signal.Signals[f"SIG{self.exit_signal}"].value
            except KeyError:
                return 255
        return self.exit_status


async def open_command(
    conn: asyncssh.SSHClientConnection,
    command: str,
    worker: int,
    on_line: OnLine | None,
    streamed: bool = False,
) -> tuple[asyncssh.SSHClientChannel, _CommandSession]:
    """Open the channel and start the command (raises if the channel cannot be opened)."""
    return await conn.create_session(
        lambda: _CommandSession(worker, on_line, streamed), command, encoding=None
    )


async def finish_command(
    channel: asyncssh.SSHClientChannel, session: _CommandSession, stdin: bytes | None, timeout: float | None
) -> CommandOutcome:
    """Send stdin, wait for the command to end (or the deadline), and collect what it produced."""
    if stdin:
        channel.write(stdin)
    channel.write_eof()
    timer = None
    if timeout is not None:
        # Past the deadline, stop waiting at once: closing the channel asks the server to stop the command,
        # but an unresponsive server must not hold the caller.
        def expire() -> None:
            if not session.closed.done():
                session.closed.set_result(TimeoutError())
            channel.close()

        timer = asyncio.get_running_loop().call_later(timeout, expire)
    try:
        exc = await session.closed
    except asyncio.CancelledError:
        channel.close()  # the caller is gone: the command must not run on unwatched
        raise
    finally:
        if timer is not None:
            timer.cancel()
    return session.output.outcome(session.status(), exc, timeout)
