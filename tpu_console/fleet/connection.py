"""One persistent SSH connection to one worker, made on first use, reused for every command, and made
again (with backoff) after it drops. Failures become `Unreachable` with a one-line reason.

Each connection also carries the worker's command channel (command_channel.py) once it is started: it
belongs to that connection, so a connection made again starts a new one, and a worker where the agent
could not start is asked again only on its next connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import asyncssh

from tpu_console import asyncssh_tuning
from tpu_console.domain import SshTarget
from tpu_console.errors import Unreachable
from tpu_console.fleet.command_channel import ChannelUnavailable, CommandChannel, open_command_channel
from tpu_console.fleet.host_keys import HostKeyCheck

CONNECT_ATTEMPTS = 3
FIRST_RETRY_DELAY_S = 0.25
# Probes an idle connection so a worker that vanished is noticed, and the next command reconnects.
KEEPALIVE_INTERVAL_S = 30.0
KEEPALIVE_COUNT_MAX = 3
# AES-GCM first: with AES-NI it costs a fraction of asyncssh's chacha20-poly1305, which builds a cipher
# per packet; every OpenSSH since 6.2 offers it. The rest of asyncssh's defaults follow as fallbacks.
ENCRYPTION_ALGS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes192-ctr",
    "aes256-ctr",
)


class _WorkerClient(asyncssh.SSHClient):
    def __init__(self, check: HostKeyCheck) -> None:
        self._check = check

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return self._check.validate(host, port, key)


class WorkerConnection:
    def __init__(self, target: SshTarget, client_key: asyncssh.SSHKey, connect_timeout: float) -> None:
        self.target = target
        self._client_key = client_key
        self._connect_timeout = connect_timeout
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None
        self._sftp_conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()
        self._sftp_lock = asyncio.Lock()  # concurrent copies share one SFTP session (sshd caps sessions)
        self._channel: CommandChannel | None = None
        self._channel_conn: asyncssh.SSHClientConnection | None = None  # the connection it runs on
        self._channel_start: asyncio.Task[CommandChannel | None] | None = None
        self.connects = 0  # how many connections were made over this object's life (reconnects show here)
        self.channels_started = 0  # how many command channels became ready (restarts show here)
        self.channel_problem: str | None = None  # why the agent could not start on this connection
        self.exec_commands = 0  # commands sent on the exec path over the current connection

    @property
    def address(self) -> str:
        return f"{self.target.host}:{self.target.port}"

    @property
    def is_connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def get(self) -> asyncssh.SSHClientConnection:
        """The open connection, connecting (again) if there is none or it was dropped."""
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        async with self._lock:  # concurrent callers share one connect attempt
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            self._forget()
            self._conn = await self._connect_with_backoff()
            self.connects += 1
            return self._conn

    async def sftp(self) -> asyncssh.SFTPClient:
        conn = await self.get()
        async with self._sftp_lock:
            if self._sftp is None or self._sftp_conn is not conn:
                self._sftp = await conn.start_sftp_client()
                self._sftp_conn = conn
            return self._sftp

    def command_channel(self) -> CommandChannel | None:
        """The command channel, when it is ready on the current connection; None means: use exec."""
        channel, conn = self._channel, self._conn
        if channel is None or not channel.is_open or conn is None or conn.is_closed():
            return None
        return channel if self._channel_conn is conn else None

    def start_command_channel(self) -> asyncio.Task[CommandChannel | None] | None:
        """Start the command channel in the background on the current connection, unless it is ready,
        on its way, or the agent could not start on this connection. Returns the task on its way."""
        conn = self._conn
        if conn is None or conn.is_closed() or self.channel_problem or self.command_channel():
            return None
        if self._channel_start is None or self._channel_start.done():
            self._channel_start = asyncio.get_running_loop().create_task(self._start_channel(conn))
        return self._channel_start

    async def _start_channel(self, conn: asyncssh.SSHClientConnection) -> CommandChannel | None:
        try:
            channel = await open_command_channel(conn, self.target.worker)
        except ChannelUnavailable as exc:
            if conn is self._conn:
                self.channel_problem = str(exc)
            return None
        if conn is not self._conn or conn.is_closed():  # dropped while the agent started
            channel.close()
            return None
        self._channel, self._channel_conn = channel, conn
        self.channels_started += 1
        return channel

    def drop(self) -> None:
        """Forget a connection that failed under us, so the next use makes a new one."""
        if self._conn is not None:
            self._conn.close()
        self._forget()

    async def close(self) -> None:
        conn = self._conn
        self._forget()
        start, self._channel_start = self._channel_start, None
        if start is not None and not start.done():
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await start
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    def _forget(self) -> None:
        self._conn = None
        self._sftp = None
        self._sftp_conn = None
        self._channel = None  # it ran on the connection forgotten here, and goes with it
        self._channel_conn = None
        self.channel_problem = None  # a new connection may try the agent again
        self.exec_commands = 0

    async def _connect_with_backoff(self) -> asyncssh.SSHClientConnection:
        delay = FIRST_RETRY_DELAY_S
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                return await self._connect_once()
            except _Transient as exc:
                if attempt == CONNECT_ATTEMPTS:
                    raise Unreachable(str(exc)) from None
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _connect_once(self) -> asyncssh.SSHClientConnection:
        asyncssh_tuning.apply()
        check = HostKeyCheck(self.target)
        where = f"({self.target.username}@{self.address})"
        try:
            return await asyncio.wait_for(
                asyncssh.connect(
                    self.target.host,
                    self.target.port,
                    username=self.target.username,
                    client_keys=[self._client_key],
                    known_hosts=check.known_hosts_arg(),
                    client_factory=lambda: _WorkerClient(check),
                    agent_path=None,  # only the key we were given, never the user's agent
                    config=None,  # and no ~/.ssh/config rewriting host, port or user behind our back
                    preferred_auth="publickey",
                    encryption_algs=ENCRYPTION_ALGS,
                    compression_algs=None,
                    keepalive_interval=KEEPALIVE_INTERVAL_S,
                    keepalive_count_max=KEEPALIVE_COUNT_MAX,
                ),
                self._connect_timeout,
            )
        except asyncssh.HostKeyNotVerifiable as exc:
            raise Unreachable(check.refusal or f"host key not accepted: {exc.reason} {where}") from None
        except asyncssh.PermissionDenied:
            raise Unreachable(
                f"permission denied: the server refused key {self.target.client_key} for user "
                f"{self.target.username!r} {where}"
            ) from None
        except TimeoutError:
            raise Unreachable(f"no answer within {self._connect_timeout:g}s {where}") from None
        except socket.gaierror as exc:
            raise Unreachable(f"unknown host {self.target.host!r}: {exc.strerror}") from None
        except ConnectionRefusedError:
            raise _Transient(f"connection refused {where}") from None
        except asyncssh.Error as exc:
            raise _Transient(f"{exc.reason or type(exc).__name__} {where}") from None
        except OSError as exc:
            raise _Transient(f"{exc.strerror or exc or type(exc).__name__} {where}") from None


class _Transient(Exception):
    """A failure worth another try: the worker may be restarting."""
