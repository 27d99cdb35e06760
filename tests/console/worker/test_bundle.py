"""Files sent to a worker as one program (worker/__init__.py's `bundle`): the command channel's agent with the
modules it imports, run as the fleet runs it, with nothing of the console importable."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tpu_console import worker
from tpu_console.fleet.command_channel import AGENT_SOURCE, loader_command


def run_alone(source: bytes) -> subprocess.CompletedProcess:
    """`source` under the fleet's loader (-I -S: the standard library only), run from `/`."""
    loader = loader_command(sys.executable).removeprefix("exec ")
    return subprocess.run(["bash", "-c", f"exec {loader}"], input=source, capture_output=True, timeout=30,
                          cwd="/", env={"PATH": "/usr/bin:/bin"})


def test_the_agent_is_sent_with_the_modules_it_imports():
    started = run_alone(AGENT_SOURCE)  # stdin closes at once: the agent greets, then exits
    assert started.stdout.startswith(b"\0tpu-console-agent "), started.stderr.decode()
    assert started.returncode == 0


@pytest.mark.parametrize("left_out", ["agent_frames.py", "agent_processes.py"])
def test_an_agent_sent_without_a_module_it_imports_does_not_start(left_out):
    started = run_alone(worker.bundle("agent.py", *{"agent_frames.py", "agent_processes.py"} - {left_out}))
    assert b"No module named" in started.stderr and started.returncode != 0
