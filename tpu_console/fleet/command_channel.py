"""A worker's command channel: one long-lived SSH session running the worker agent (agent.py),
over which the fleet sends commands once it is ready.

Why: a command on the exec path costs a whole SSH session, about 8 packets each way (channel open and
confirmation, exec request, window, data, EOF, exit status, close, close), each built, encrypted, sent,
received and dispatched in Python on both ends, 64 times for a 64-worker fan-out. On the command channel a
command is one request frame out and, for a quiet command, one frame back with its exit status.

The agent is started with a short loader on the command line and its source written to the session's
stdin (see agent.py), so it needs only `python3` (3.8+) on the worker and a shell that can `exec`
it: a stock OpenSSH sshd, a Cloud TPU VM and a local pod all qualify. A worker where it cannot start
raises `ChannelUnavailable` here, and the fleet keeps using the exec path there.
"""

from __future__ import annotations

import asyncio
import itertools

import asyncssh

from tpu_console import worker
from tpu_console.fleet.output import CommandOutcome, CommandOutput, OnLine
from tpu_console.fleet.program import PythonProgram, python_from_stdin
from tpu_console.worker import agent_frames as frames

# The interpreter the loader runs; a name looked up on the worker's PATH.
AGENT_PYTHON = "python3"
# A cold start of 64 agents on a 2-core machine takes about a second; a real host far less.
START_TIMEOUT_S = 30.0
# The agent, with the frames it speaks and the processes it starts.
AGENT_SOURCE = worker.bundle("agent.py", "agent_frames.py", "agent_processes.py")
_STDERR_KEPT = 2048  # the agent's own stderr, kept to say why it did not start


class ChannelUnavailable(Exception):
    """The agent could not be started on this worker (one line: why)."""


def loader_command(python: str | None = None) -> str:
    """The command line that starts the agent: it reads the agent's source (and nothing more) from stdin."""
    return python_from_stdin(python or AGENT_PYTHON, len(AGENT_SOURCE))


class _Request:
    """One command sent over the channel, until its exit frame (or its end some other way)."""

    def __init__(self, output: CommandOutput) -> None:
        self.output = output
        self.exit_status: int | None = None
        self.done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def end(self, exc: BaseException | None) -> None:
        if not self.done.done():
            self.output.end()
            self.done.set_result(exc)


class CommandChannel(asyncssh.SSHClientSession[bytes]):
    def __init__(self, worker: int) -> None:
        self._worker = worker
        self._chan: asyncssh.SSHClientChannel | None = None
        self._incoming = bytearray()
        self._agent_stderr = b""
        self._requests: dict[int, _Request] = {}
        self._ids = itertools.count(1)
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read, even if unawaited
        self.closed = False
        self.exit_status: int | None = None

    # -- asyncssh callbacks ----------------------------------------------------------------------------

    def connection_made(self, chan: asyncssh.SSHClientChannel) -> None:
        self._chan = chan

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if datatype == asyncssh.EXTENDED_DATA_STDERR:
            self._agent_stderr = (self._agent_stderr + data)[-_STDERR_KEPT:]
            return
        self._incoming += data
        if not self.ready.done() and not self._found_magic():
            return
        for kind, request_id, body in frames.split_frames(self._incoming):
            request = self._requests.get(request_id)
            if request is None:
                continue  # a command the fleet stopped waiting for (timed out)
            if kind == frames.STDOUT:
                request.output.add("stdout", body)
            elif kind == frames.STDERR:
                request.output.add("stderr", body)
            elif kind == frames.EXIT:
                (request.exit_status,) = frames.STATUS.unpack(body)
                del self._requests[request_id]
                request.end(None)

    def exit_status_received(self, status: int) -> None:
        self.exit_status = status

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ChannelUnavailable(self._why_not_started(exc)))
        lost = exc or ConnectionError("the command channel closed")
        requests, self._requests = self._requests, {}
        for request in requests.values():
            request.end(lost)

    # -- the fleet's side ------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.ready.done() and not self.closed

    async def run(
        self,
        command: str | PythonProgram,
        stdin: bytes | None,
        timeout: float | None,
        on_line: OnLine | None,
        streamed: bool = False,
    ) -> CommandOutcome:
        """Run one command, or a Python program in a fork of the agent, on the worker; same outcome as
        the exec path (command.py)."""
        assert self._chan is not None
        request_id = next(self._ids)
        request = _Request(CommandOutput(self._worker, on_line, streamed))
        self._requests[request_id] = request
        if isinstance(command, PythonProgram):
            args = [arg.encode("utf-8", errors="surrogateescape") for arg in command.args]
            self._chan.write(frames.encode_python(request_id, command.source, args))
        else:
            text = command.encode("utf-8", errors="surrogateescape")
            self._chan.write(frames.encode_run(request_id, text, stdin or b""))
        timer = None
        if timeout is not None:
            timer = asyncio.get_running_loop().call_later(timeout, self._give_up, request_id, TimeoutError())
        try:
            exc = await request.done
        except asyncio.CancelledError:
            self._give_up(request_id, None)  # the caller is gone: the command must not run on unwatched
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return request.output.outcome(request.exit_status, exc, timeout)

    def close(self) -> None:
        if self._chan is not None:
            self._chan.close()

    # -- helpers ---------------------------------------------------------------------------------------

    def _give_up(self, request_id: int, exc: BaseException | None) -> None:
        """Stop waiting for a command and have the agent stop it (its process group, as on timeout)."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        if not self.closed and self._chan is not None:
            self._chan.write(frames.encode_frame(frames.KILL, request_id))
        request.end(exc)

    def _found_magic(self) -> bool:
        """Anything before the agent's greeting (a login banner, say) is dropped."""
        at = self._incoming.find(frames.MAGIC)
        if at < 0:
            del self._incoming[: -len(frames.MAGIC)]
            return False
        del self._incoming[: at + len(frames.MAGIC)]
        self.ready.set_result(None)
        return True

    def _why_not_started(self, exc: Exception | None) -> str:
        said = [line for line in self._agent_stderr.decode(errors="replace").splitlines() if line.strip()]
        if said:
            return said[-1].strip()
        if exc is not None:
            return f"connection lost: {getattr(exc, 'reason', None) or exc}"
        return f"the agent exited with status {self.exit_status}"


async def open_command_channel(
    conn: asyncssh.SSHClientConnection, worker: int, timeout: float = START_TIMEOUT_S
) -> CommandChannel:
    """Start the agent on the worker and wait for its greeting. Raises ChannelUnavailable."""
    try:
        chan, channel = await conn.create_session(
            lambda: CommandChannel(worker), loader_command(), encoding=None
        )
    except (asyncssh.Error, OSError) as exc:
        raise ChannelUnavailable(f"cannot open a session: {getattr(exc, 'reason', None) or exc}") from None
    try:
        chan.write(AGENT_SOURCE)
    except (BrokenPipeError, ConnectionError):
        # The loader already exited (no python3 there, say): its stderr says why, once the channel closed.
        pass
    try:
        await asyncio.wait_for(asyncio.shield(channel.ready), timeout)
    except TimeoutError:
        chan.close()
        raise ChannelUnavailable(f"the agent did not start within {timeout:g}s") from None
    return channel
