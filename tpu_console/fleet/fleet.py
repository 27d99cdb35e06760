"""Run commands on all workers of a node (or a selection) over persistent SSH connections.

Every call returns one result per worker, ordered by worker: a worker that cannot be reached, times out
or drops its connection gets a result with `error` set; it never raises for the whole fleet.

Commands take one of two paths to a worker. Once the worker's command channel is ready (one long-lived
session running a small agent, see command_channel.py), a command is one request on it; until then, and
where the agent cannot run, each command is an SSH session of its own (the exec path, command.py). The
first commands on a connection take the exec path, the second one starts the channel in the background
for the next ones (CHANNEL_AFTER_COMMANDS), so a one-off command pays nothing for it. Both paths give
the same results.

Concurrency is bounded twice: per SSH server (host, port), because OpenSSH refuses connections beyond
MaxStartups and channels beyond MaxSessions (10 each by default), and overall, so a large pod does not
open hundreds of channels at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import re
import secrets
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import asyncssh

from tpu_console.domain import SshTarget
from tpu_console.errors import Unreachable, UserError
from tpu_console.fleet.command import finish_command, open_command
from tpu_console.fleet.connection import WorkerConnection
from tpu_console.fleet.output import OnLine
from tpu_console.fleet.program import PythonProgram
from tpu_console.fleet.results import WorkerLine, WorkerResult

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Failures that mean the channel never opened, so the command did not start and may be sent again.
_NOT_STARTED = (asyncssh.ChannelOpenError, asyncssh.ConnectionLost, asyncssh.DisconnectError, ConnectionError)


__all__ = ["Fleet", "WorkerLine", "WorkerResult"]

# A connection's command channel is started in the background after its second exec-path command:
# a connection used twice is likely used again, and a one-off command (`tpu-console exec`) never pays
# for an agent it would not use.
CHANNEL_AFTER_COMMANDS = 2


class Fleet:
    def __init__(
        self,
        targets: list[SshTarget],
        *,
        per_host_limit: int = 8,
        overall_limit: int = 64,
        connect_timeout: float = 10.0,
        command_channels: bool = True,
    ) -> None:
        """`command_channels=False` keeps every command on the exec path (one SSH session each)."""
        self.targets = {t.worker: t for t in sorted(targets, key=lambda t: t.worker)}
        self._per_host_limit = per_host_limit
        self._overall = asyncio.Semaphore(overall_limit)
        self._per_host: dict[tuple[str, int], asyncio.Semaphore] = {}
        self._connect_timeout = connect_timeout
        self._keys: dict[Path, asyncssh.SSHKey] = {}
        self._connections: dict[int, WorkerConnection] = {}
        self._use_channels = command_channels
        self._homes: dict[int, str] = {}
        self._home_locks: dict[int, asyncio.Lock] = {}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def connection(self, worker: int) -> WorkerConnection:
        """The worker's persistent connection (made on first use)."""
        if worker not in self._connections:
            target = self.targets[worker]
            self._connections[worker] = WorkerConnection(
                target, self._client_key(target), self._connect_timeout
            )
        return self._connections[worker]

    async def run(
        self,
        command: str | PythonProgram,
        workers: Sequence[int] | None = None,
        *,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        stdin: str | bytes | None = None,
        on_line: OnLine | None = None,
    ) -> list[WorkerResult]:
        """Run `command` with bash on each selected worker (all by default), or a Python program
        (program.py: in a fork of the command channel's agent, else its own python3).

        `env` is exported at the head of the command, so it shows in the worker's process list: never
        put secrets there (upload them to a 0600 file with `put` instead). A Python program takes none.
        """
        selected = self._select(workers)
        if isinstance(command, PythonProgram) and env:
            raise ValueError("a Python program runs in the worker's environment: give it no `env`")
        full_command = command if isinstance(command, PythonProgram) else _with_env(command, env or {})
        data = stdin.encode() if isinstance(stdin, str) else stdin
        return list(
            await asyncio.gather(*(self._run_one(w, full_command, timeout, data, on_line) for w in selected))
        )

    async def follow(self, command: str | PythonProgram, worker: int, on_line: OnLine) -> WorkerResult:
        """Run a long-lived command or Python program (program.py) on one worker, its stdout going to
        `on_line` only (the result keeps none of it: a follow may stream for days). It holds a session on
        its worker's SSH server, as any command, but no place in the overall limit: following every
        worker of a 64-worker pod must leave room for other commands. Cancelling it stops it on the
        worker."""
        self._select([worker])
        return await self._run_one(worker, command, None, None, on_line, long_lived=True)

    async def start_command_channels(self, workers: Sequence[int] | None = None) -> dict[int, str]:
        """Connect and start the command channel on each selected worker now, rather than after its
        second command. Returns the workers where it did not start, with why; those keep the exec path."""
        selected = self._select(workers)

        async def start(worker: int) -> str | None:
            conn = self.connection(worker)
            try:
                await conn.get()
            except Unreachable as exc:
                return f"unreachable: {exc}"
            starting = conn.start_command_channel()
            if starting is not None:
                await asyncio.shield(starting)
            return None if conn.command_channel() else conn.channel_problem or "the command channel closed"

        problems = await asyncio.gather(*(start(w) for w in selected))
        return {w: problem for w, problem in zip(selected, problems, strict=True) if problem}

    async def put(
        self,
        data_or_path: bytes | Path,
        remote_path: str,
        workers: Sequence[int] | None = None,
        mode: int = 0o644,
    ) -> list[WorkerResult]:
        """Write a file on each selected worker over SFTP, atomically (temp file, then rename).

        A relative `remote_path` is taken from the worker's $HOME (see `home`); missing parent folders
        are made.
        """
        selected = self._select(workers)
        data = data_or_path.read_bytes() if isinstance(data_or_path, Path) else bytes(data_or_path)
        return list(await asyncio.gather(*(self._put_one(w, data, remote_path, mode) for w in selected)))

    async def get(self, remote_path: str, worker: int) -> bytes:
        """Read a file from one worker. Raises Unreachable, or FileNotFoundError if it does not exist."""
        self._select([worker])
        shown = remote_path  # errors name the path as the caller gave it
        if not remote_path.startswith("/"):
            remote_path = posixpath.join(await self.home(worker), remote_path)
        conn = self.connection(worker)
        async with self._host_slot(conn.target), self._overall:
            try:
                sftp = await conn.sftp()
                async with sftp.open(remote_path, "rb") as remote:
                    return await remote.read()
            except asyncssh.SFTPNoSuchFile:
                raise FileNotFoundError(f"worker {worker}: no file {shown}") from None
            except _NOT_STARTED as exc:
                conn.drop()
                raise Unreachable(f"worker {worker}: connection lost ({_reason(exc)})") from None

    async def close(self) -> None:
        connections, self._connections = list(self._connections.values()), {}
        await asyncio.gather(*(c.close() for c in connections))

    # -- one worker ------------------------------------------------------------------------------------

    async def _run_one(
        self,
        worker: int,
        command: str | PythonProgram,
        timeout: float | None,
        stdin: bytes | None,
        on_line: OnLine | None,
        long_lived: bool = False,
    ) -> WorkerResult:
        start = time.perf_counter()
        conn = self.connection(worker)
        async with self._host_slot(conn.target):
            channel = conn.command_channel() if self._use_channels else None
            if channel is not None:
                # One frame out on a session already open: no place in the overall limit, which bounds the
                # SSH channels opened at once and would send a 256-worker fan-out out in waves.
                outcome = await channel.run(command, stdin, timeout, on_line, long_lived)
            else:
                async with contextlib.nullcontext() if long_lived else self._overall:
                    if isinstance(command, PythonProgram):  # no agent to fork it: its own interpreter
                        command, stdin = command.command_line(), command.source
                    try:
                        chan, session = await self._open(conn, command, worker, on_line, long_lived)
                    except Unreachable as exc:
                        return WorkerResult(
                            worker, None, "", "", time.perf_counter() - start, f"unreachable: {exc}"
                        )
                    outcome = await finish_command(chan, session, stdin, timeout)
                conn.exec_commands += 1
                if self._use_channels and conn.exec_commands >= CHANNEL_AFTER_COMMANDS:
                    conn.start_command_channel()  # for the next commands on this connection
        if outcome.error and outcome.error.startswith("connection lost"):
            if channel is None or not conn.is_connected:  # a lost agent alone leaves the connection be
                conn.drop()
            outcome.error = f"{outcome.error} ({conn.address})"
        return WorkerResult(
            worker,
            outcome.exit_status,
            outcome.stdout.decode("utf-8", errors="replace"),
            outcome.stderr.decode("utf-8", errors="replace"),
            time.perf_counter() - start,
            outcome.error,
        )

    async def _open(
        self,
        conn: WorkerConnection,
        command: str,
        worker: int,
        on_line: OnLine | None,
        streamed: bool = False,
    ) -> tuple[asyncssh.SSHClientChannel, object]:
        """Open the command's channel. A connection that died while idle is replaced once: the command
        had not started, so sending it again is safe."""
        for attempt in (1, 2):
            ssh = await conn.get()
            try:
                return await open_command(ssh, command, worker, on_line, streamed)
            except (*_NOT_STARTED, AttributeError) as exc:
                # asyncssh raises AttributeError ('session_started') when the connection closes while the
                # channel opens; on a connection still open it is a real bug and goes up as it is.
                if isinstance(exc, AttributeError) and not ssh.is_closed():
                    raise
                if not ssh.is_closed():
                    # The server refused this one channel (e.g. MaxSessions); the connection and the
                    # other commands on it are fine.
                    raise Unreachable(f"channel refused: {_reason(exc)} ({conn.address})") from None
                conn.drop()
                if attempt == 2:
                    raise Unreachable(f"{_reason(exc)} ({conn.address})") from None
        raise AssertionError("unreachable")

    async def home(self, worker: int) -> str:
        """The worker's $HOME as its shell sees it (asked once per connection). SFTP resolves relative
        paths from the account's home in the password database, which a session's environment can
        override (sshd's SetEnv, a login script); shell and SFTP must agree on where `~` is."""
        if worker not in self._homes:
            # concurrent copies to one worker ask once
            async with self._home_locks.setdefault(worker, asyncio.Lock()):
                if worker not in self._homes:
                    (answer,) = await self.run('printf "%s" "$HOME"', [worker], timeout=30)
                    if not answer.ok or not answer.stdout.startswith("/"):
                        raise Unreachable(answer.error or f"worker {worker}: could not read $HOME")
                    self._homes[worker] = answer.stdout
        return self._homes[worker]

    async def _put_one(self, worker: int, data: bytes, remote_path: str, mode: int) -> WorkerResult:
        start = time.perf_counter()
        conn = self.connection(worker)

        def result(error: str | None) -> WorkerResult:
            return WorkerResult(worker, None if error else 0, "", "", time.perf_counter() - start, error)

        if not remote_path.startswith("/"):
            try:
                remote_path = posixpath.join(await self.home(worker), remote_path)
            except Unreachable as exc:
                return result(f"unreachable: {exc}")

        async with self._host_slot(conn.target), self._overall:
            try:
                sftp = await conn.sftp()
                parent = posixpath.dirname(remote_path)
                if parent:
                    await sftp.makedirs(parent, exist_ok=True)
                tmp = f"{remote_path}.tmp-{secrets.token_hex(4)}"
                async with sftp.open(tmp, "wb", asyncssh.SFTPAttrs(permissions=mode)) as remote:
                    await remote.write(data)
                await sftp.chmod(tmp, mode)  # the server's umask may have narrowed the mode on open
                await sftp.posix_rename(tmp, remote_path)
            except Unreachable as exc:
                return result(f"unreachable: {exc}")
            except asyncssh.SFTPError as exc:
                return result(f"sftp: {exc.reason} ({remote_path})")
            except (asyncssh.Error, OSError) as exc:
                conn.drop()
                return result(f"connection lost while copying: {_reason(exc)} ({conn.address})")
        return result(None)

    # -- helpers ---------------------------------------------------------------------------------------

    def _select(self, workers: Sequence[int] | None) -> list[int]:
        """Check the selection and the client keys before anything is sent to any worker."""
        if workers is None:
            selected = list(self.targets)
        else:
            unknown = [w for w in workers if w not in self.targets]
            if unknown:
                valid = f"0-{len(self.targets) - 1}" if self.targets else "none"
                raise UserError(f"no worker {unknown[0]} on this node; valid workers: {valid}")
            selected = sorted(set(workers))
        for worker in selected:
            self.connection(worker)  # reads the worker's client key: a bad key fails here, for all
        return selected

    def _host_slot(self, target: SshTarget) -> asyncio.Semaphore:
        key = (target.host, target.port)
        if key not in self._per_host:
            self._per_host[key] = asyncio.Semaphore(self._per_host_limit)
        return self._per_host[key]

    def _client_key(self, target: SshTarget) -> asyncssh.SSHKey:
        # Parsed once per key file, not once per connection.
        if target.client_key not in self._keys:
            try:
                self._keys[target.client_key] = asyncssh.read_private_key(target.client_key)
            except (OSError, asyncssh.KeyImportError) as exc:
                raise UserError(f"cannot read SSH key {target.client_key} ({exc}); check the path") from None
        return self._keys[target.client_key]


def _with_env(command: str, env: dict[str, str]) -> str:
    for name in env:
        if not _ENV_NAME.match(name):
            raise UserError(f"invalid environment variable name {name!r}; use letters, digits and _")
    exports = "".join(f"export {name}={shlex.quote(value)}; " for name, value in env.items())
    return exports + command


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.Error):
        return exc.reason or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
