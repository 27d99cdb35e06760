"""The worker agent on its own, spoken to over pipes as the fleet does over SSH: started by the same
loader with its source on stdin, frames both ways. Each test runs with pidfds (Linux 5.3+, Python 3.9+)
and with SIGCHLD, the way the agent learns of exits under Python 3.8."""

from __future__ import annotations

import hashlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.processes import pid_alive, wait_for
from tpu_console.fleet.command_channel import AGENT_SOURCE, loader_command
from tpu_console.worker import agent
from tpu_console.worker import agent_frames as frames


class AgentProcess:
    """The agent under test, and a reader of its frames."""

    def __init__(self, cwd: Path, without_pidfd: bool) -> None:
        loader = loader_command(sys.executable).removeprefix("exec ")
        if without_pidfd:  # as on Python 3.8: no os.pidfd_open
            loader = loader.replace("-c 'import sys;", "-c 'import os,sys;del os.pidfd_open;")
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {loader}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            bufsize=0,
        )
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(AGENT_SOURCE)
        self._incoming = bytearray()
        greeting = self._read_until(lambda: frames.MAGIC in self._incoming, 20)
        assert greeting, self.process.stderr.read() if self.process.poll() is not None else "no greeting"
        del self._incoming[: self._incoming.index(frames.MAGIC) + len(frames.MAGIC)]
        self.frames: list[tuple[bytes, int, bytes]] = []

    def send(self, data: bytes) -> None:
        assert self.process.stdin
        self.process.stdin.write(data)

    def run(self, request_id: int, command: str, stdin: bytes = b"") -> None:
        self.send(frames.encode_run(request_id, command.encode(), stdin))

    def result(self, request_id: int, timeout: float = 20) -> tuple[bytes, bytes, int]:
        """stdout, stderr and exit status of a command, once its EXIT frame came."""

        def exited() -> bool:
            self.frames += frames.split_frames(self._incoming)
            return any(kind == frames.EXIT and rid == request_id for kind, rid, _ in self.frames)

        assert self._read_until(exited, timeout), f"no exit for request {request_id}: {self.frames}"
        mine = [(kind, body) for kind, rid, body in self.frames if rid == request_id]
        assert mine[-1][0] == frames.EXIT  # the last frame of a command
        stdout = b"".join(body for kind, body in mine if kind == frames.STDOUT)
        stderr = b"".join(body for kind, body in mine if kind == frames.STDERR)
        (status,) = frames.STATUS.unpack(mine[-1][1])
        return stdout, stderr, status

    def lines(self, request_id: int, count: int, timeout: float = 20) -> list[bytes]:
        """The first `count` lines a running command wrote to stdout."""

        def arrived() -> list[bytes]:
            self.frames += frames.split_frames(self._incoming)
            out = b"".join(
                body for kind, rid, body in self.frames if rid == request_id and kind == frames.STDOUT
            )
            return out.splitlines()[:count] if out.count(b"\n") >= count else []

        assert self._read_until(arrived, timeout), f"fewer than {count} lines from request {request_id}"
        return arrived()

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin
            self.process.stdin.close()
            self.process.wait(10)

    def _read_until(self, done, timeout: float) -> bool:
        assert self.process.stdout
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return False
            data = os.read(self.process.stdout.fileno(), 65536)
            if not data:
                return done()
            self._incoming += data
        return True


@pytest.fixture(params=["pidfd", "sigchld"])
def worker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentProcess]:
    process = AgentProcess(tmp_path, without_pidfd=request.param == "sigchld")
    try:
        yield process
    finally:
        process.close()


def test_frames_split_only_when_whole():
    buffer = bytearray(frames.encode_run(1, b"echo hi", b"in") + frames.encode_frame(frames.KILL, 2))
    tail = frames.encode_frame(frames.STDOUT, 3, b"partial")
    buffer += tail[:-2]
    assert frames.split_frames(buffer) == [(frames.RUN, 1, b"\0\0\0\x07echo hiin"), (frames.KILL, 2, b"")]
    assert buffer == tail[:-2]  # the incomplete frame waits for its end
    buffer += tail[-2:]
    assert frames.split_frames(buffer) == [(frames.STDOUT, 3, b"partial")] and not buffer


def test_output_streams_exit_status_and_stdin(worker: AgentProcess, tmp_path: Path):
    worker.run(1, 'echo "out $PWD"; echo err >&2; exit 7')
    assert worker.result(1) == (f"out {tmp_path}\n".encode(), b"err\n", 7)
    worker.run(2, "tr a-z A-Z; printf done", stdin=b"from the fleet\n")
    assert worker.result(2) == (b"FROM THE FLEET\ndone", b"", 0)
    worker.run(3, "kill -TERM $$")
    assert worker.result(3) == (b"", b"", 128 + 15)


def test_each_command_gets_a_fresh_shell(worker: AgentProcess):
    worker.run(1, "LEFT=1; cd /; echo $$")
    first_pid, _, _ = worker.result(1)
    time.sleep(agent.REFILL_DELAY_S + 0.2)  # the next spare is ready by now
    worker.run(2, 'echo "${LEFT-unset} $PWD $$ ${__tpu_command-unset}"')
    left, pwd, pid, leftover = worker.result(2)[0].decode().split()
    assert (left, leftover) == ("unset", "unset") and pwd != "/" and pid != first_pid.decode().strip()


def test_concurrent_long_and_large_commands(worker: AgentProcess):
    big = "x" * (agent.SPARE_MAX_COMMAND_BYTES + 10)  # too long for the spare: its own bash -c
    worker.run(1, f"sleep 0.5; echo {big} | wc -c")
    worker.run(2, "echo quick")  # arrives while 1 runs: no spare left, so a bash of its own
    worker.run(3, "head -c 3000000 /dev/zero | tr '\\0' y")  # more output than a pipe holds
    data = bytes(range(256)) * 4096  # 1 MiB of stdin, more than a pipe holds
    worker.run(4, "sha256sum | cut -c1-16", stdin=data)
    assert worker.result(2) == (b"quick\n", b"", 0)
    stdout, _, status = worker.result(3)
    assert status == 0 and stdout == b"y" * 3000000
    assert worker.result(4) == (hashlib.sha256(data).hexdigest()[:16].encode() + b"\n", b"", 0)
    assert worker.result(1) == (f"{len(big) + 1}\n".encode(), b"", 0)


def test_a_reader_that_falls_behind_slows_the_command_but_not_the_agent(worker: AgentProcess):
    worker.run(1, "echo $$; exec yes")  # output as fast as a pipe takes it
    [pid] = map(int, worker.lines(1, 1))
    time.sleep(0.5)  # nobody reads: the agent's stdout and then the command's pipe fill up
    rss_kib = int(Path(f"/proc/{worker.process.pid}/status").read_text().split("VmRSS:")[1].split()[0])
    assert rss_kib < 64 * 1024  # the agent holds about OUTBOX_HIGH of output, not all `yes` could write
    worker.send(frames.encode_frame(frames.KILL, 1))  # still read while its output waits
    wait_for(lambda: not pid_alive(pid), timeout=5)
    stdout, _, status = worker.result(1)
    assert status == 128 + 15 and set(stdout.splitlines()[1:]) == {b"y"}


def test_kill_stops_the_process_group(worker: AgentProcess):
    worker.run(1, "sleep 60 & echo $!; wait")
    [sleeper] = map(int, worker.lines(1, 1))  # a background child: in the command's process group
    assert pid_alive(sleeper)
    worker.send(frames.encode_frame(frames.KILL, 1))
    assert worker.result(1)[2] == 128 + 15
    wait_for(lambda: not pid_alive(sleeper), timeout=5)


def test_closing_the_session_stops_running_commands_but_not_detached_jobs(worker: AgentProcess):
    worker.run(1, "setsid nohup sleep 60 > /dev/null 2>&1 < /dev/null & echo $!; sleep 60 & echo $!; wait")
    detached, attached = map(int, worker.lines(1, 2))
    wait_for(lambda: os.getsid(detached) == detached)  # setsid has run: a session of its own
    worker.close()  # stdin closes, as when the SSH session ends
    assert worker.process.returncode == 0
    wait_for(lambda: not pid_alive(attached), timeout=5)
    assert pid_alive(detached)
    os.kill(detached, 9)


PROGRAM = b"""
import os, sys
print("args", sys.argv[1:], "pgid is pid", os.getpgid(0) == os.getpid(), flush=True)
print("open fds", sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:3], flush=True)
if sys.argv[1] == "fail":
    raise ValueError("boom")
if sys.argv[1] == "wait":
    import time
    time.sleep(60)
sys.exit(int(sys.argv[2]))
"""


def test_a_python_program_runs_in_a_fork_of_the_agent_with_its_arguments(worker: AgentProcess):
    worker.send(frames.encode_python(1, PROGRAM, [b"exit", b"5"]))
    stdout, stderr, status = worker.result(1)
    assert status == 5 and stderr == b""
    args_line, fds_line = stdout.decode().splitlines()
    assert args_line == "args ['exit', '5'] pgid is pid True"  # a session of its own: KILL stops it all
    assert fds_line == "open fds [0, 1, 2]"  # nothing of the agent's (its SSH channel, epoll) leaks in
    worker.send(frames.encode_python(2, PROGRAM, [b"fail"]))
    stdout, stderr, status = worker.result(2)
    assert status == 1 and stderr.decode().splitlines()[-1] == "ValueError: boom"
    worker.send(frames.encode_python(3, PROGRAM, [b"wait"]))
    worker.lines(3, 1)
    worker.send(frames.encode_frame(frames.KILL, 3))
    assert worker.result(3)[2] == 128 + 15
    worker.run(4, "echo still serving")  # the agent itself carries on
    assert worker.result(4) == (b"still serving\n", b"", 0)
