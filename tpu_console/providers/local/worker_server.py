"""The SSH server of one simulated worker: asyncssh on 127.0.0.1, a real bash behind it.

One server per worker, each on its own port with its own host key, rather than one server routing by
username: the pod then looks to the fleet code exactly like a real one (one sshd per worker, one
connection per worker, a host key per worker to pin), and the per-host concurrency limits apply per
worker as they would on a TPU pod.

Each command runs in a fresh bash in a new session (so a timed-out or abandoned command can be stopped
by killing its process group), with HOME and the working directory set to the worker folder: usually a
bash started ahead of time and waiting for it (see spare_shell.py), else `bash -c <command>`.
A job the command detaches (`setsid nohup ... &`) is in a session of its own and outlives this server
and the console process.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import posixpath
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from tpu_console import asyncssh_tuning
from tpu_console.providers.local.child_process import ChildProcess, start_child
from tpu_console.providers.local.spare_shell import SpareShells
from tpu_console.providers.local.store import LOOPBACK
from tpu_console.worker.agent import LONG_COMMAND_S

_CHUNK = 65536
_OUTPUT_HIGH_WATER = 1 << 20  # bytes of output waiting for the client before the pipes pause
_STOP_GRACE_S = 2.0


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    count: int
    devices: int
    home: Path
    host_key: asyncssh.SSHKey

    @property
    def tpu_log_dir(self) -> Path:
        return self.home / "tpu_logs"

    def environment(self) -> dict[str, str]:
        """A login-like environment: clean, but with the console's PATH (venv first) so `python` is the
        interpreter that has the trainer installed."""
        user = _user()
        venv_bin = str(Path(sys.executable).parent)
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env = {
            "HOME": str(self.home),
            "USER": user,
            "LOGNAME": user,
            "SHELL": "/bin/bash",
            "PATH": f"{venv_bin}:{path}",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TPU_WORKER_ID": str(self.index),
            "TPU_WORKER_COUNT": str(self.count),
            # Each worker process sees its own D CPU devices, as a TPU host sees its chips.
            "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={self.devices}",
            # libtpu's log folder, as a TPU VM's /tmp/tpu_logs is its own: not this machine's, where the
            # console's planner logs, and which Ray (in any job that starts it) streams into the job's output
            "TPU_LOG_DIR": str(self.tpu_log_dir),
        }
        if tmpdir := os.environ.get("TMPDIR"):
            env["TMPDIR"] = tmpdir
        return env


class WorkerServer:
    def __init__(self, spec: WorkerSpec, authorized_key_line: str) -> None:
        self.spec = spec
        self._authorized = asyncssh.import_authorized_keys(authorized_key_line + "\n")
        self._env = spec.environment()
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._running: set[ChildProcess] = set()
        self._connections: set[asyncssh.SSHServerConnection] = set()
        self.spares = SpareShells(spec.home, self._env)
        self.port = 0

    async def start(self, port: int = 0) -> int:
        asyncssh_tuning.apply()
        if self.spec.home.is_dir():  # Ray takes TPU_LOG_DIR only where the folder is there
            self.spec.tpu_log_dir.mkdir(exist_ok=True)
        home = os.fsencode(self.spec.home)
        self._acceptor = await asyncssh.listen(
            LOOPBACK,
            port,
            server_factory=lambda: _ConnectionTracker(self._connections),
            server_host_keys=[self.spec.host_key],
            authorized_client_keys=self._authorized,
            process_factory=self._handle,
            sftp_factory=lambda chan: _WorkerSftp(chan, home),
            encoding=None,
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
            line_editor=False,
        )
        self.port = self._acceptor.sockets[0].getsockname()[1]
        self.spares = SpareShells(self.spec.home, self._env)  # a restarted server starts afresh
        self.spares.start()
        return self.port

    async def close(self) -> None:
        """Stop listening and drop every connection, as a worker going down would."""
        attached = list(self._running)  # before their handlers end with the connections
        if self._acceptor is not None:
            self._acceptor.close()
            for conn in list(self._connections):
                conn.close()
            await self._acceptor.wait_closed()
            self._acceptor = None
        await self.spares.close()
        # Commands still attached to a channel die with the server, as they would with sshd: TERM
        # first, so that a command agent (worker/agent.py) stops the commands it runs, then KILL.
        for child in attached:
            _signal_group(child.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(child.wait() for child in attached)), _STOP_GRACE_S)
        for child in attached:
            if not child.exited.done():
                _signal_group(child.pid, signal.SIGKILL)

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        child = self.spares.run(process.command) if process.command is not None else None
        self.spares.start_later(LONG_COMMAND_S)  # sooner, at its end, if the command is short
        try:
            if child is None:
                argv = ["bash", "-c", process.command] if process.command is not None else ["bash", "-s"]
                child = await start_child(argv, self.spec.home, self._env)
        except OSError as exc:
            process.stderr.write(f"cannot start bash: {exc}\n".encode())
            process.exit(127)
            return
        self._running.add(child)
        try:
            await self._serve(process, child)
        except Exception as exc:  # noqa: BLE001 - a bug here must fail this command, not the connection
            _signal_group(child.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                process.stderr.write(f"local worker server error: {exc!r}\n".encode())
                process.exit(255)
        finally:
            self._running.discard(child)
            self.spares.start_later()

    async def _serve(self, process: asyncssh.SSHServerProcess, child: ChildProcess) -> None:
        feeder = asyncio.create_task(_feed(process.stdin, child.stdin))
        _OutputForwarder(child, process)
        finished = asyncio.ensure_future(
            asyncio.gather(child.stdout.closed, child.stderr.closed, child.wait())
        )
        closed = asyncio.ensure_future(process.channel.wait_closed())
        try:
            await asyncio.wait({finished, closed}, return_when=asyncio.FIRST_COMPLETED)
            feeder.cancel()
            if finished.done() and finished.exception() is None:
                status = finished.result()[2]
                # bash reports death by signal N as 128+N; keep that convention for the client.
                process.exit(status if status >= 0 else 128 - status)
                return
            # The client went away (timeout, dropped connection): stop what the command started.
            _signal_group(child.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(child.wait(), _STOP_GRACE_S)
            except TimeoutError:
                _signal_group(child.pid, signal.SIGKILL)
        finally:  # also when the server is shut down under us
            feeder.cancel()
            closed.cancel()
            finished.cancel()
            finished.add_done_callback(lambda f: f.cancelled() or f.exception())  # nothing left unread


class _ConnectionTracker(asyncssh.SSHServer):
    """Keeps the server's set of open connections, so closing the server can close them too."""

    def __init__(self, connections: set[asyncssh.SSHServerConnection]) -> None:
        self._connections = connections
        self._conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self._conn)  # type: ignore[arg-type]


class _WorkerSftp(asyncssh.SFTPServer):
    """Relative paths resolve from the worker's HOME, as with sshd's sftp-server; absolute paths as is."""

    def __init__(self, chan: asyncssh.SSHServerChannel, home: bytes) -> None:
        super().__init__(chan)
        self._home = home

    def map_path(self, path: bytes) -> bytes:
        return path if path.startswith(b"/") else posixpath.join(self._home, path)


async def _feed(source: asyncssh.SSHReader, sink: asyncio.WriteTransport) -> None:
    try:
        while chunk := await source.read(_CHUNK):
            if sink.is_closing():
                break  # the command closed its stdin; like sshd, drop the rest
            sink.write(chunk)
    except (BrokenPipeError, ConnectionResetError, asyncssh.Error):
        pass
    finally:
        sink.close()


class _OutputForwarder:
    """The command's stdout and stderr to the channel as they come, from the pipes' callbacks. When the
    client reads slower than the command writes, reading the pipes pauses (and the command blocks on
    its writes) until the channel has drained."""

    def __init__(self, child: ChildProcess, process: asyncssh.SSHServerProcess) -> None:
        self._child = child
        self._process = process
        self._resuming: asyncio.Task[None] | None = None
        child.stdout.attach(self._sink(None))
        child.stderr.attach(self._sink(asyncssh.EXTENDED_DATA_STDERR))

    def _sink(self, datatype: asyncssh.DataType) -> Callable[[bytes], None]:
        channel = self._process.channel

        def write(data: bytes) -> None:
            if channel.is_closing():
                return  # the client went away; the command is being stopped
            channel.write(data, datatype)
            if self._resuming is None and channel.get_write_buffer_size() > _OUTPUT_HIGH_WATER:
                self._child.stdout.pause()
                self._child.stderr.pause()
                self._resuming = asyncio.get_running_loop().create_task(self._resume_when_drained())

        return write

    async def _resume_when_drained(self) -> None:
        with contextlib.suppress(Exception):
            await self._process.stdout.drain()
        self._resuming = None
        self._child.stdout.resume()
        self._child.stderr.resume()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _user() -> str:
    try:
        return getpass.getuser()
    except OSError:
        return "worker"
