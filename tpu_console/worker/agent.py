"""The worker side of the fleet's command channel: a small agent that runs commands sent over one
long-lived SSH session, so a warm command costs one write and a few reads instead of a whole SSH
session (open, exec, exit status, close).

The fleet ships this file: it starts `python3 -I -S -c 'import sys;exec(sys.stdin.buffer.read(N))'`
on the worker and writes this source with its two modules' (N bytes, `worker.bundle`) to the session's
stdin, so nothing but that short loader ever shows on a command line. It needs Python 3.8+ and its
standard library only, and must run under any python3 a worker has (the system one on a Cloud TPU VM, the
console's on a local pod): no third-party imports, no syntax newer than 3.8.

The frames both ways are agent_frames.py's, and the processes it starts are agent_processes.py's; the
fleet sends both modules with this file, as one program (`worker.bundle`).

Each command runs in a fresh bash in a session of its own (so it can be stopped by killing its process
group) with the agent's environment and working directory, the worker's home. Like the local worker
server (tpu_console/providers/local/spare_shell.py), the agent keeps one bash started ahead of time,
blocked reading a command from a pipe, its pipes already watched, so a command waits for no process to
be created; the next one is started REFILL_DELAY_S after a command ends, off the command's path.

When the session ends (stdin closes: the console closed it or the connection dropped) or the agent is
told to stop (SIGTERM, SIGHUP), every running command's process group is stopped as above and the agent
exits. Jobs a command detached with `setsid` are in sessions of their own and are not touched.
"""

from __future__ import annotations

import os
import signal
import sys
import time

try:  # on a worker: sent with this file as one program (worker.bundle)
    import agent_frames as frames
    from agent_processes import (
        Child,
        Poller,
        close_fd,
        exit_status,
        find_bash,
        run_program,
        signal_group,
        still_running,
    )
except ImportError:  # imported as tpu_console.worker.agent (the console, the local pods' worker servers)
    from tpu_console.worker import agent_frames as frames
    from tpu_console.worker.agent_processes import (
        Child,
        Poller,
        close_fd,
        exit_status,
        find_bash,
        run_program,
        signal_group,
        still_running,
    )

# A command goes to the spare bash through a pipe that takes it in one write; longer ones start their
# own `bash -c` (as do commands that find no spare ready, e.g. two at once).
SPARE_MAX_COMMAND_BYTES = 32768
# The next spare starts this long after a command ends, or after a long command has run LONG_COMMAND_S:
# started at once, the new shells of a 64-worker fan-out would compete for the CPU with its end.
REFILL_DELAY_S = 0.1
LONG_COMMAND_S = 1.0
STOP_GRACE_S = 2.0
# On shutdown, a little less: whoever stops the agent itself (the local worker server) waits 2 s.
SHUTDOWN_GRACE_S = 1.5
CHUNK = 65536
# Output waiting to go to the fleet: past OUTBOX_HIGH the agent stops reading its commands' output until
# it is back under OUTBOX_LOW, so a slow reader slows the commands (their pipes fill) instead of growing
# the agent's memory, and the agent keeps reading requests (a KILL) all the while.
OUTBOX_HIGH = 1 << 20
OUTBOX_LOW = 1 << 18



def spare_loader(fd: int) -> str:
    """Run by a spare bash: read one NUL-terminated command from `fd`, close it so the command's processes
    do not inherit it, forget the variable, and run the text in this same bash. EOF without a command (the
    spare discarded) exits quietly. The local pods' worker servers start their spares with it too."""
    return (f'IFS= read -r -d "" -u {fd} __tpu_command || exit 0; exec {fd}<&-; '
            'eval "unset __tpu_command; $__tpu_command"')


SPARE_LOADER = spare_loader(3)  # the agent hands its spares the command pipe as fd 3


class Agent:
    def __init__(self, bash: str):
        self.bash = bash
        self.poller = Poller()
        self.handlers = {}  # fd -> (method, child)
        self.running = {}  # request id -> Child
        self.spare = None  # a Child waiting for a command, or None
        self.refill_at = None  # when to start the next spare
        self.inbox = bytearray()  # request bytes not yet a whole frame
        self.outbox = bytearray()  # frames not yet written to the fleet
        self.writing = False  # stdout is watched for room: the outbox did not fit in one write
        self.output_fds = set()  # the commands' stdout and stderr pipes
        self.output_paused = False  # those are not watched: the outbox is over OUTBOX_HIGH
        self.stopping = False
        self.use_pidfd = hasattr(os, "pidfd_open")
        self.sigchld_fd = -1
        signal.signal(signal.SIGTERM, lambda signum, frame: self.shutdown())
        signal.signal(signal.SIGHUP, lambda signum, frame: self.shutdown())
        self.poller.register(0)
        self.handlers[0] = (self._on_requests, None)
        os.set_blocking(1, False)  # a full stdout must not stop the loop: frames wait in the outbox

    # -- the loop ------------------------------------------------------------------------------------

    def serve(self) -> None:
        self._start_spare()
        os.write(1, frames.MAGIC)
        handlers = self.handlers
        timeout = None
        while True:
            for fd, _ in self.poller.poll(timeout):
                entry = handlers.get(fd)
                if entry is not None:  # else a descriptor closed earlier in this round
                    entry[0](entry[1])
            timeout = self._run_timers()
            if self.outbox and not self.writing:
                self._flush(None)
            else:
                self._pace_output()

    def _run_timers(self):
        """Run what is due; the seconds until the next timer, or None when none is set."""
        now = time.monotonic()
        deadline = None
        for child in self.running.values():
            if child.kill_at is not None:
                if now >= child.kill_at:
                    child.kill_at = None
                    signal_group(child.pid, signal.SIGKILL)
                elif deadline is None or child.kill_at < deadline:
                    deadline = child.kill_at
        if self.refill_at is not None and now >= self.refill_at:
            self.refill_at = None
            self._start_spare()
        if self.refill_at is not None and (deadline is None or self.refill_at < deadline):
            deadline = self.refill_at
        return None if deadline is None else max(0.0, deadline - now)

    def _flush(self, _child) -> None:
        """Write what stdout takes now; watch it for room while anything is left."""
        try:
            written = os.write(1, self.outbox)
        except BlockingIOError:
            written = 0
        except OSError:  # the session is gone
            self.shutdown()
            return
        del self.outbox[:written]
        if self.outbox and not self.writing:
            self.writing = True
            self.poller.register(1, write=True)
            self.handlers[1] = (self._flush, None)
        elif not self.outbox and self.writing:
            self.writing = False
            del self.handlers[1]
            self.poller.unregister(1)
        self._pace_output()

    def _pace_output(self) -> None:
        if not self.output_paused and len(self.outbox) > OUTBOX_HIGH:
            self.output_paused = True
            for fd in self.output_fds:
                self.poller.unregister(fd)
        elif self.output_paused and len(self.outbox) < OUTBOX_LOW:
            self.output_paused = False
            for fd in self.output_fds:
                self.poller.register(fd)

    # -- requests ------------------------------------------------------------------------------------

    def _on_requests(self, _child) -> None:
        try:
            data = os.read(0, CHUNK)
        except BlockingIOError:  # stdin shares stdout's (now non-blocking) file: nothing yet
            return
        if not data:
            self.shutdown()
        self.inbox += data
        for kind, request_id, body in frames.split_frames(self.inbox):
            if kind in (frames.RUN, frames.PYTHON):
                (length,) = frames.LENGTH.unpack_from(body)
                end = frames.LENGTH.size + length
                if kind == frames.RUN:
                    self._run(request_id, body[frames.LENGTH.size : end], body[end:])
                else:
                    args = body[end:].split(b"\0") if len(body) > end else []
                    self._run_python(request_id, body[frames.LENGTH.size : end], args)
            elif kind == frames.KILL and request_id in self.running:
                child = self.running[request_id]
                signal_group(child.pid, signal.SIGTERM)
                child.kill_at = time.monotonic() + STOP_GRACE_S

    def _run(self, request_id: int, text: bytes, stdin: bytes) -> None:
        child = self._take_spare(text)
        if child is None:
            try:
                child = self._spawn([b"bash", b"-c", text])
            except (OSError, ValueError) as exc:
                message = f"cannot start bash: {exc}\n"
                self.outbox += frames.encode_frame(frames.STDERR, request_id, message.encode())
                self.outbox += frames.encode_frame(frames.EXIT, request_id, frames.STATUS.pack(127))
                return
        child.request_id = request_id
        child.started = time.monotonic()
        self.running[request_id] = child
        for kind, data in child.early:
            self.outbox += frames.encode_frame(kind, request_id, data)
        child.early = []
        if stdin:
            child.pending_stdin = stdin
            self._watch(child.stdin_fd, self._on_stdin, child, write=True)
        else:
            close_fd(child.stdin_fd)
            child.stdin_fd = -1
        self._refill_by(child.started + LONG_COMMAND_S)  # sooner, at its end, if it is short

    def _run_python(self, request_id: int, source: bytes, args) -> None:
        try:
            child = self._fork_python(source, args)
        except OSError as exc:
            self.outbox += frames.encode_frame(frames.STDERR, request_id, f"cannot fork: {exc}\n".encode())
            self.outbox += frames.encode_frame(frames.EXIT, request_id, frames.STATUS.pack(127))
            return
        child.request_id = request_id
        child.started = time.monotonic()
        self.running[request_id] = child
        close_fd(child.stdin_fd)  # the program gets an empty stdin
        child.stdin_fd = -1

    # -- a child's output, input and exit ------------------------------------------------------------

    def _on_stdout(self, child: Child) -> None:
        self._read_output(child, child.stdout_fd, frames.STDOUT)

    def _on_stderr(self, child: Child) -> None:
        self._read_output(child, child.stderr_fd, frames.STDERR)

    def _read_output(self, child: Child, fd: int, kind: bytes) -> None:
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            if child.request_id is None:
                child.early.append((kind, data))
            else:
                self.outbox += frames.encode_frame(kind, child.request_id, data)
            return
        self._forget(fd)
        if kind == frames.STDOUT:
            child.stdout_fd = -1
        else:
            child.stderr_fd = -1
        child.open_streams -= 1
        self._finish_if_done(child)

    def _on_stdin(self, child: Child) -> None:
        try:
            written = os.write(child.stdin_fd, child.pending_stdin[:CHUNK])
            child.pending_stdin = child.pending_stdin[written:]
        except BlockingIOError:
            return
        except OSError:  # the command closed its stdin; like sshd, drop the rest
            child.pending_stdin = b""
        if not child.pending_stdin:
            self._forget(child.stdin_fd)
            child.stdin_fd = -1

    def _on_exit(self, child: Child) -> None:
        try:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = child.pid, 255 << 8
        if pid == 0:
            return
        self._forget(child.pidfd)
        child.pidfd = -1
        self._exited(child, status)

    def _on_sigchld(self, _child) -> None:
        """Where there are no pidfds: some child exited; find which."""
        try:
            while os.read(self.sigchld_fd, 512):
                pass
        except OSError:
            pass
        children = list(self.running.values())
        if self.spare is not None:
            children.append(self.spare)
        for child in children:
            if child.wait_status is None:
                self._on_exit(child)

    def _exited(self, child: Child, status: int) -> None:
        child.wait_status = status
        if child is self.spare:
            self._discard_spare()
            self._refill_by(time.monotonic() + REFILL_DELAY_S)
        else:
            self._finish_if_done(child)

    def _finish_if_done(self, child: Child) -> None:
        if child.open_streams or child.wait_status is None or child.request_id not in self.running:
            return
        if child.stdin_fd >= 0:
            self._forget(child.stdin_fd)
            child.stdin_fd = -1
        del self.running[child.request_id]
        status = frames.STATUS.pack(exit_status(child.wait_status))
        self.outbox += frames.encode_frame(frames.EXIT, child.request_id, status)
        self._refill_by(time.monotonic() + REFILL_DELAY_S)

    # -- processes -----------------------------------------------------------------------------------

    def _spawn(self, argv, command_pipe: int = -1) -> Child:
        """Start bash in a session of its own, its pipes and its exit watched from now on."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        actions = [
            (os.POSIX_SPAWN_DUP2, stdin_r, 0),
            (os.POSIX_SPAWN_DUP2, stdout_w, 1),
            (os.POSIX_SPAWN_DUP2, stderr_w, 2),
        ]
        if command_pipe >= 0:
            actions.append((os.POSIX_SPAWN_DUP2, command_pipe, 3))
        try:
            pid = os.posix_spawn(
                self.bash,
                argv,
                os.environ,
                file_actions=actions,
                setsid=True,  # a session of its own: stopping the command stops its whole group
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # Python ignores these; bash should not
            )
        except BaseException:
            for fd in (stdin_w, stdout_r, stderr_r):
                close_fd(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                close_fd(fd)
        return self._adopt(pid, stdin_w, stdout_r, stderr_r)

    def _fork_python(self, source: bytes, args) -> Child:
        """Run a Python program in a fork of this process, in a session of its own, watched as `_spawn`'s."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        try:
            pid = os.fork()
        except BaseException:
            for fd in (stdin_r, stdin_w, stdout_r, stdout_w, stderr_r, stderr_w):
                close_fd(fd)
            raise
        if pid == 0:
            run_program(source, args, stdin_r, stdout_w, stderr_w)  # never returns
        for fd in (stdin_r, stdout_w, stderr_w):
            close_fd(fd)
        return self._adopt(pid, stdin_w, stdout_r, stderr_r)

    def _adopt(self, pid: int, stdin_w: int, stdout_r: int, stderr_r: int) -> Child:
        """Watch a new child's pipes and exit from now on."""
        for fd in (stdin_w, stdout_r, stderr_r):
            os.set_blocking(fd, False)
        child = Child(pid, self._pidfd(pid), stdin_w, stdout_r, stderr_r, -1)
        self._watch(stdout_r, self._on_stdout, child, output=True)
        self._watch(stderr_r, self._on_stderr, child, output=True)
        if child.pidfd >= 0:
            self._watch(child.pidfd, self._on_exit, child)
        return child

    def _pidfd(self, pid: int) -> int:
        if self.use_pidfd:
            try:
                return os.pidfd_open(pid)
            except OSError:  # a kernel before 5.3
                self.use_pidfd = False
        if self.sigchld_fd < 0:
            wake_r, wake_w = os.pipe()
            os.set_blocking(wake_r, False)
            os.set_blocking(wake_w, False)
            self.sigchld_fd = wake_r
            signal.set_wakeup_fd(wake_w)  # a child's exit interrupts the poll through this pipe
            signal.signal(signal.SIGCHLD, lambda signum, frame: None)
            self._watch(wake_r, self._on_sigchld, None)
        return -1

    def _start_spare(self) -> None:
        if self.spare is not None or self.stopping:
            return
        command_r, command_w = os.pipe()
        try:
            self.spare = self._spawn([b"bash", b"-c", SPARE_LOADER.encode()], command_pipe=command_r)
        except (OSError, ValueError):
            close_fd(command_w)  # no spare this time: commands start their own bash
            return
        finally:
            close_fd(command_r)
        self.spare.command_fd = command_w

    def _take_spare(self, text: bytes):
        """Hand `text` to the spare and return it as the command's process, or None if there is no
        usable spare (the caller then starts a bash itself)."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        data = text + b"\0"
        if spare.wait_status is not None or len(data) > SPARE_MAX_COMMAND_BYTES or b"\0" in text:
            self._discard(spare)
            return None
        try:
            written = os.write(spare.command_fd, data)
        except OSError:
            written = -1
        close_fd(spare.command_fd)
        spare.command_fd = -1
        if written != len(data):  # the spare died under us; it never saw a whole command
            self._discard(spare)
            return None
        return spare

    def _discard_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            self._discard(spare)

    def _discard(self, child: Child) -> None:
        close_fd(child.command_fd)
        for fd in (child.stdin_fd, child.stdout_fd, child.stderr_fd, child.pidfd):
            if fd >= 0:
                self._forget(fd)
        if child.wait_status is None:
            signal_group(child.pid, signal.SIGKILL)
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass

    def _refill_by(self, when: float) -> None:
        if self.spare is None and (self.refill_at is None or when < self.refill_at):
            self.refill_at = when

    def _watch(self, fd: int, method, child, write: bool = False, output: bool = False) -> None:
        self.handlers[fd] = (method, child)
        if output:
            self.output_fds.add(fd)
            if self.output_paused:
                return  # watched once the outbox drains
        self.poller.register(fd, write)

    def _forget(self, fd: int) -> None:
        if self.handlers.pop(fd, None) is not None:
            paused = fd in self.output_fds and self.output_paused
            self.output_fds.discard(fd)
            if not paused:
                self.poller.unregister(fd)
        close_fd(fd)

    # -- the end -------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop every running command's process group (TERM, then KILL after the grace) and exit."""
        if self.stopping:
            return
        self.stopping = True
        self._discard_spare()
        running = [c for c in self.running.values() if c.wait_status is None]
        for child in running:
            signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while running and time.monotonic() < deadline:
            time.sleep(0.02)
            running = [c for c in running if still_running(c.pid)]
        for child in running:
            signal_group(child.pid, signal.SIGKILL)
        os._exit(0)


def main() -> None:
    if sys.version_info < (3, 8) or not hasattr(os, "posix_spawn"):
        sys.stderr.write("tpu-console agent: needs python 3.8+ with os.posix_spawn\n")
        sys.exit(3)
    bash = find_bash()
    if bash is None:
        sys.stderr.write("tpu-console agent: no bash on PATH\n")
        sys.exit(3)
    Agent(bash).serve()


if __name__ == "__main__":
    main()
