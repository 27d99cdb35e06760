"""The processes the command channel's agent (agent.py) starts and watches: a bash that runs one command
(`Child`, a spare until it is handed one), a fork of the agent that runs a Python program as __main__
(`run_program`), their process groups signalled, their exit statuses as bash gives them; and the poller the
agent waits on.

Python 3.8+ and the standard library only: it runs on the workers, sent with agent.py.
"""

from __future__ import annotations

import os
import select
import signal
import sys


def exit_status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


class Child:
    """A bash the agent started, and the one command it runs (None while it is the spare)."""

    def __init__(self, pid: int, pidfd: int, stdin_fd: int, stdout_fd: int, stderr_fd: int, command_fd: int):
        self.pid = pid  # also its process group: it leads a session of its own
        self.pidfd = pidfd  # readable once it exits; -1 where pidfds are missing (SIGCHLD instead)
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.command_fd = command_fd  # where a spare is handed its command; -1 once handed or for bash -c
        self.request_id = None
        self.early = []  # (kind, data) written while a spare (a startup warning): the command's output
        self.open_streams = 2
        self.wait_status = None
        self.pending_stdin = b""
        self.started = 0.0
        self.kill_at = None  # when a stopped command gets SIGKILL


class Poller:
    """epoll where there is one (Linux), else poll: readiness of a few descriptors, and nothing more."""

    def __init__(self):
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._poll = None if self._epoll else select.poll()
        self._read = select.EPOLLIN if self._epoll else select.POLLIN
        self._write = select.EPOLLOUT if self._epoll else select.POLLOUT

    def register(self, fd: int, write: bool = False) -> None:
        (self._epoll or self._poll).register(fd, self._write if write else self._read)

    def unregister(self, fd: int) -> None:
        (self._epoll or self._poll).unregister(fd)

    def poll(self, timeout):
        """(fd, events) pairs of the ready descriptors; timeout in seconds, None to wait for ever."""
        if self._epoll is not None:
            return self._epoll.poll(-1 if timeout is None else timeout)
        return self._poll.poll(None if timeout is None else timeout * 1000)


def close_fd(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(source: bytes, args, stdin_fd: int, stdout_fd: int, stderr_fd: int) -> None:
    """In a fresh fork of the agent: become a session of our own with the three pipes as stdin, stdout and
    stderr, let go of everything else the agent holds, and run the program as __main__ with `args` as
    sys.argv[1:]. Exits with its status (1 for an exception, after its traceback); never returns."""
    status = 1
    try:
        os.setsid()  # stopping it stops its whole group, as for a command
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
            os.dup2(fd, target)
            os.set_blocking(target, True)
        for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else range(3, 256):
            if int(fd) > 2:
                close_fd(int(fd))
        sys.argv = ["-c"] + [arg.decode("utf-8", "surrogateescape") for arg in args]
        exec(compile(source, "<program>", "exec"), {"__name__": "__main__"})  # noqa: S102 - what it is for
        status = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:  # noqa: BLE001 - whatever it was, its traceback is the program's stderr
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a reader that went away: nothing more to say
                pass
        os._exit(status)


def still_running(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    except ChildProcessError:
        return False


def find_bash():
    for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/bin", "/usr/bin"]:
        path = os.path.join(folder or ".", "bash")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None
