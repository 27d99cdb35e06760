"""`stacks` of a program that knows nothing of tpu-console (observe/stacks.py): py-spy reads a foreign Python
program from the outside, through the same shell command a worker runs, and its dump groups as the
trainer's faulthandler dump does."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.absent import PTRACE_FIX, absent
from tests.processes import wait_for
from tpu_console.observe import stacks

PY_SPY = Path(sys.prefix) / "bin" / "py-spy"
FOREIGN = """\
import time

def wait_for_the_others():
    time.sleep(60)

def train():
    wait_for_the_others()

train()
"""
DUMP = """\
Process 4242: python -u train.py --mesh-data 2
Python v3.12.1 (/usr/bin/python3.12)

Thread 4242 (idle): "MainThread"
    wait_for_the_others (nash_mhc/train.py:4)
    train (nash_mhc/train.py:7)
    <module> (nash_mhc/train.py:9)
Thread 4250 (idle): "Thread-1 (_monitor)"
    wait (threading.py:359)
"""


def test_a_py_spy_dump_reads_as_faulthandlers():
    text = stacks.from_py_spy(DUMP)
    assert "4242:" not in text and "Python v" not in text
    assert stacks.where(text) == "nash_mhc/train.py:4 (wait_for_the_others)"
    # another worker in the same place: other pids, and its main thread caught running, not idle
    moved = DUMP.replace("4242", "5151").replace("4250", "5160").replace("idle", "active", 1)
    other = stacks.from_py_spy(moved)
    found = stacks.group([stacks.WorkerStacks(0, dump=text), stacks.WorkerStacks(1, dump=other)], "r", "n")
    assert [g.workers for g in found.groups] == [[0, 1]]  # the same stacks, thread ids and states aside


def test_py_spy_places_add_the_consoles_own_for_a_local_pod():
    class Record:
        provider = "local"

    assert stacks.py_spy_places(Record())[-1] == str(PY_SPY)
    Record.provider = "gcp"
    assert stacks.py_spy_places(Record()) == stacks.PY_SPY


def run_recipe(home: Path, run_id: str, places: tuple[str, ...]) -> stacks.WorkerStacks:
    command = stacks.dump_stacks_py_spy(run_id, places, wait_s=5)
    done = subprocess.run(["bash", "-c", command], env={**os.environ, "HOME": str(home)},
                          capture_output=True, text=True, timeout=30)
    return stacks.parse_answer(0, done.stdout, done.stderr)


def test_the_worker_command_dumps_a_foreign_programs_stacks(tmp_path):
    if not PY_SPY.exists():
        absent(f"py-spy is not installed at {PY_SPY}", "pip install py-spy, or scripts/test's dev extra")
    run_id = "20260101-000000-abcd"
    folder = tmp_path / "tpu-console" / "runs" / run_id
    folder.mkdir(parents=True)
    (folder / "foreign.py").write_text(FOREIGN)
    job = subprocess.Popen([sys.executable, "foreign.py"], cwd=folder)
    try:
        (folder / "job.pid").write_text(f"{job.pid}\n")
        assert run_recipe(tmp_path, run_id, ("~/nowhere/py-spy", "no-such-py-spy")).silent == stacks.NO_PY_SPY
        answers = []

        def in_its_sleep() -> bool:  # the interpreter may still be starting
            answers.append(run_recipe(tmp_path, run_id, (str(PY_SPY),)))
            if answers[-1].silent and "ermission" in answers[-1].silent:
                absent(f"ptrace is refused here: {answers[-1].silent}", PTRACE_FIX)
            return answers[-1].dump is not None and "wait_for_the_others" in answers[-1].dump

        wait_for(in_its_sleep, timeout=20, poll=0.2)
        text = stacks.from_py_spy(answers[-1].dump)
        assert stacks.where(text).endswith("foreign.py:4 (wait_for_the_others)"), text
    finally:
        job.kill()
        job.wait()
    assert run_recipe(tmp_path, run_id, (str(PY_SPY),)).silent == "its job has ended"
    shutil.rmtree(folder)
    assert run_recipe(tmp_path, run_id, (str(PY_SPY),)).silent == "no run folder"


def test_base64_of_the_answer_is_what_parse_answer_reads():
    body = base64.b64encode(DUMP.encode()).decode()
    assert stacks.parse_answer(3, f"state=answered\n{body}\n", None).dump == DUMP
    assert "Operation not permitted" in stacks.parse_answer(
        3, "state=failed Error: Operation not permitted (os error 1)\n", None).silent
