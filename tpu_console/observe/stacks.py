"""Where a run is stuck: every worker's Python stacks, asked for at once and grouped.

`collect_stacks` signals each worker's job (SIGUSR1: the trainer's faulthandler appends every thread's stack
to `stacks.txt` in its run folder, trainer/cli.py) and reads the dump back; a command job (any program,
which has no such handler) is read from the outside with `py-spy dump` instead (installed by bootstrap;
`from_py_spy` turns its text into faulthandler's, so the rest is the same). `group` puts workers whose
stacks are the same (thread ids aside) together, so the odd ones out stand apart: "workers 0,2,3: all-reduce
in trainer/grpo.py:201 (update); worker 1: trainer/data.py:40 (loading)"; on a multislice node, slice by
slice ("slice 0 (workers 0-3): ... | slice 1 (workers 4-7): workers 4,5,7: ...; worker 6: ..."), a stack
shared across slices still printed once. A job that does not answer
(stopped, or blocked where Python cannot run a handler) is named with its process state. Beside the stacks,
libtpu's own view of each worker's chips (observe/device_metrics.py): busy (duty cycle) and idle for how
long, which tells a wait inside a device program (a collective: busy) from one on the host (idle).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpu_console.domain import worker_slices
from tpu_console.errors import Unreachable, UserError, one_line
from tpu_console.fleet import run_recipes
from tpu_console.history.store import RunRecord
from tpu_console.observe.device_metrics import WorkerDeviceMetrics, read_device_metrics
from tpu_console.observe.reach import NodeWorkers, reach_node
from tpu_console.providers.base import Provider
from tpu_console.provision.worker_inspection import inspect_workers, worker_python

_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+")
_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>.+)$')
# ps states: what a job that did not answer is doing.
# py-spy dump's lines: `Thread 4242 (idle): "MainThread"` and `    wait (foreign.py:5)`.
_PY_SPY_THREAD = re.compile(
    r"^Thread (?:0x)?(?P<id>[0-9a-fA-F]+)(?: \((?:idle|active|gil)[^)]*\))?(?P<rest>.*)$"
)
_PY_SPY_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<path>.+):(?P<line>\d+)\)$")
# Where `stacks` looks for py-spy on a worker: bootstrap's environment, then PATH.
PY_SPY = ("~/tpu-console/env/bin/py-spy", "py-spy")
NO_PY_SPY = "py-spy is not on the worker: run `tpu-console bootstrap NODE` (it installs py-spy)"
PROCESS_STATES = {"T": "stopped (SIGSTOP)", "t": "stopped by a debugger", "D": "in uninterruptible I/O",
                  "Z": "a zombie", "S": "sleeping", "R": "running"}


@dataclass(frozen=True)
class WorkerStacks:
    worker: int
    dump: str | None = None  # faulthandler's text, when it answered
    silent: str | None = None  # why there is no dump


@dataclass
class StackGroup:
    workers: list[int]
    where: str  # the innermost frame of the main thread: "trainer/grpo.py:201 (update)"
    stack: str  # the dump, thread ids removed


@dataclass
class RunStacks:
    run_id: str
    node: str
    groups: list[StackGroup] = field(default_factory=list)
    silent: dict[int, str] = field(default_factory=dict)
    devices: list[WorkerDeviceMetrics] = field(default_factory=list)  # libtpu's view, where it reports
    slice_of: dict[int, int] = field(default_factory=dict)  # a multislice run's workers by slice; {}: one

    def summary(self) -> str:
        if not self.slice_of:
            parts = [f"{_workers(g.workers)}: {g.where}" for g in self.groups]
            parts += [f"worker {w}: did not answer ({why})" for w, why in sorted(self.silent.items())]
            return "; ".join(parts) or "no worker's job is running"
        if len(self.groups) == 1 and not self.silent:  # the same stack everywhere: said once
            slices = sorted(set(self.slice_of.values()))
            everyone = _in_ranges(self.groups[0].workers)
            return f"slices {_ranges(slices)} ({everyone}): {self.groups[0].where}"
        return " | ".join(self._slice_summary(index) for index in sorted(set(self.slice_of.values())))

    def _slice_summary(self, index: int) -> str:
        """`slice 1 (workers 4-7): workers 4,5,7: WHERE; worker 6: WHERE`, or `slice 0 (workers 0-3): WHERE`
        when the whole slice is in one place."""
        members = [w for w, s in sorted(self.slice_of.items()) if s == index]
        places = [(here, g.where) for g in self.groups if (here := [w for w in g.workers if w in members])]
        places += [([w], f"did not answer ({why})") for w, why in sorted(self.silent.items()) if w in members]
        head = f"slice {index} ({_in_ranges(members)})"
        if len(places) == 1 and places[0][0] == members:
            return f"{head}: {places[0][1]}"
        return f"{head}: " + "; ".join(f"{_in_ranges(ws)}: {where}" for ws, where in places)

    def who(self, stack_group: StackGroup) -> str:
        """A group's workers; slice by slice on a multislice (`slice 0: workers 0-3; slice 1: worker 4`)."""
        if not self.slice_of:
            return _workers(stack_group.workers)
        by_slice: dict[int, list[int]] = {}
        for worker in stack_group.workers:
            by_slice.setdefault(self.slice_of.get(worker, 0), []).append(worker)
        return "; ".join(f"slice {s}: {_in_ranges(ws)}" for s, ws in sorted(by_slice.items()))

    def device_line(self) -> str | None:
        """`libtpu: worker 0: TensorCores 98% busy, idle 0s; worker 1: ...`, or why nothing is reported."""
        if not self.devices:
            return None
        if all(w.not_reported for w in self.devices):
            return f"libtpu: not reported ({self.devices[0].not_reported})"
        parts = []
        for answer in self.devices:
            if answer.not_reported:
                parts.append(f"worker {answer.worker}: not reported")
                continue
            duty = sorted({d.duty_cycle_pct for d in answer.devices if d.duty_cycle_pct is not None})
            idle = [d.idle_s for d in answer.devices if d.idle_s is not None]
            busy = f"{duty[0]:.0f}-{duty[-1]:.0f}%" if len(duty) > 1 else f"{duty[0]:.0f}%" if duty else "?"
            parts.append(f"worker {answer.worker}: TensorCores {busy} busy"
                         + (f", idle up to {max(idle):.0f}s" if idle else ""))
        return "libtpu: " + "; ".join(parts)

    def to_json(self) -> dict:
        groups = [vars(g) for g in self.groups]
        if self.slice_of:  # each group's slices too
            groups = [{**g, "slices": sorted({self.slice_of.get(w, 0) for w in g["workers"]})}
                      for g in groups]
        return {"run_id": self.run_id, "node": self.node, "summary": self.summary(), "groups": groups,
                "silent": [{"worker": w, "why": why} for w, why in sorted(self.silent.items())],
                "libtpu": [{"worker": a.worker, "not_reported": a.not_reported,
                            "devices": [vars(d) for d in a.devices]} for a in self.devices]}


def from_py_spy(text: str) -> str:
    """py-spy dump's text as faulthandler writes it (threads, innermost frame first): what `threads`,
    `where` and `normalize` read. What differs between workers in the same place is left out: the process
    lines (pids) and a thread's momentary state (idle, active)."""
    out: list[str] = []
    for line in text.splitlines():
        if thread := _PY_SPY_THREAD.match(line):
            out.append(f"Thread 0x{int(thread['id'], 16 if line[7:9] == '0x' else 10):x}{thread['rest']}")
        elif frame := _PY_SPY_FRAME.match(line):
            out.append(f'  File "{frame["path"]}", line {frame["line"]} in {frame["func"]}')
        elif out and line.startswith("        "):  # --locals and the like: kept with their frame
            out.append(line)
    return "\n".join(out)


def is_command_job(record: RunRecord) -> bool:
    """A job other than the bundled trainer (launch -- CMD, or a job file): no SIGUSR1 handler there."""
    job = getattr(record, "job", None)
    return isinstance(job, dict) and job.get("kind") == "command"


def py_spy_places(record: RunRecord) -> tuple[str, ...]:
    """Where py-spy may be on the run's workers: a local pod's workers are this machine, so the console's
    own py-spy (a dependency of the console) serves them too."""
    if record.provider == "local":
        return (*PY_SPY, str(Path(sys.prefix) / "bin" / "py-spy"))
    return PY_SPY


def dump_stacks_py_spy(run_id: str, py_spy: Sequence[str], wait_s: float = 5.0) -> str:
    """`py-spy dump` of the run's job and its child processes: any Python program's stacks, without its
    help. `py_spy`: where py-spy may be, tried in order (a word without a slash is looked up on PATH); `sudo
    -n` is tried when ptrace is refused. Prints `state=answered` and the dump base64-encoded on one line,
    `state=no-py-spy`, `state=failed` and py-spy's last line, `state=starting` (no job.pid yet),
    `state=ended` or `state=missing`."""
    d = _home_word(run_recipes.run_dir(run_id))
    candidates = " ".join(_home_word(c[2:]) if c.startswith("~/") else shlex.quote(c) for c in py_spy)
    timeout = max(1, int(wait_s))
    return (
        f"( cd {d} 2>/dev/null || {{ echo state=missing; exit 0; }}; "
        # the job itself (job_runner.py's child), never the runner: until it has started, say so
        'if [ -e exit ]; then echo state=ended; exit 0; fi; '
        "p=$(cat job.pid 2>/dev/null); "
        'case "$p" in ""|*[!0-9]*) echo state=starting; exit 0;; esac; '
        'if ! kill -0 "$p" 2>/dev/null; then echo state=ended; exit 0; fi; '
        f"s=; for c in {candidates}; do "
        'c=$(command -v "$c" 2>/dev/null) && [ -x "$c" ] && { s=$c; break; }; done; '
        '[ -n "$s" ] || { echo state=no-py-spy; exit 0; }; '
        f'd=$(timeout {timeout} "$s" dump --pid "$p" --subprocesses 2>&1) || {{ e=$d; '
        f'd=$(timeout {timeout} sudo -n "$s" dump --pid "$p" --subprocesses 2>&1) || '
        '{ echo "state=failed $(printf %s "$e" | tail -n 1)"; exit 0; }; }; '
        "echo state=answered; printf %s \"$d\" | base64 | tr -d '\\n'; echo )"
    )


def _home_word(relative: str) -> str:
    """A shell word for `~/relative` that expands $HOME but nothing in `relative`."""
    return '"$HOME"/' + shlex.quote(relative)


def normalize(dump: str) -> str:
    """The dump without what differs between identical stacks: thread ids."""
    lines = [_THREAD.sub(lambda m: m.group(1), line.rstrip()) for line in dump.strip().splitlines()]
    return "\n".join(lines)


def threads(dump: str) -> list[list[tuple[str, int, str]]]:
    """Each thread's frames, innermost first, as (path, line, function)."""
    found: list[list[tuple[str, int, str]]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            found.append([])
        elif (frame := _FRAME.match(line)) and found:
            found[-1].append((frame["path"], int(frame["line"]), frame["func"].strip()))
    return found


def where(dump: str) -> str:
    """Where the main thread (the one whose outermost frame is `<module>`) is: its innermost frame of the
    run's own code, and the library call it waits in, if any ("trainer/grpo.py:201 (update), inside
    jax/_src/...:88 (block_until_ready)")."""
    stacks = [t for t in threads(dump) if t]
    if not stacks:
        return "no Python frames"
    main = next((t for t in stacks if t[-1][2] == "<module>"), stacks[-1])
    own = next((frame for frame in main if not _library(frame[0])), main[0])
    text = _frame(own)
    return text if own is main[0] else f"{text}, inside {_frame(main[0])}"


def _frame(frame: tuple[str, int, str]) -> str:
    path, line, func = frame
    return f"{short_path(path)}:{line} ({func})"


def _library(path: str) -> bool:
    """The standard library or an installed package other than the trainer."""
    if "/site-packages/" in path or "/dist-packages/" in path:
        return not short_path(path).startswith("trainer/")
    return bool(re.search(r"/lib/python3\.\d+/", path)) or path.startswith("<")


def short_path(path: str) -> str:
    """`/home/u/tpu-console/env/lib/python3.11/site-packages/trainer/grpo.py` -> `trainer/grpo.py`."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    match = re.search(r"/((?:trainer|tpu_console|jax|jaxlib|flax|optax)/.*)$", path)
    if match is None and not path.startswith("/"):
        return path  # already short (py-spy's abbreviated names: `nash_mhc/train.py`)
    return match.group(1) if match else path.rsplit("/", 1)[-1]


def group(answers: list[WorkerStacks], run_id: str, node: str) -> RunStacks:
    result = RunStacks(run_id, node)
    by_stack: dict[str, StackGroup] = {}
    for answer in answers:
        if answer.dump is None:
            result.silent[answer.worker] = answer.silent or "no answer"
            continue
        key = normalize(answer.dump)
        if key not in by_stack:
            by_stack[key] = StackGroup([], where(answer.dump), key)
        by_stack[key].workers.append(answer.worker)
    # the largest group first: the odd ones out come after it
    result.groups = sorted(by_stack.values(), key=lambda g: (-len(g.workers), g.workers))
    return result


def parse_answer(worker: int, stdout: str, error: str | None) -> WorkerStacks:
    lines = stdout.strip().splitlines()
    state = next((line for line in lines if line.startswith("state=")), "")
    if state == "state=answered":
        body = lines[lines.index(state) + 1] if lines.index(state) + 1 < len(lines) else ""
        try:
            return WorkerStacks(worker, dump=base64.b64decode(body).decode("utf-8", "replace"))
        except (binascii.Error, ValueError):
            return WorkerStacks(worker, silent="its dump could not be read")
    if state.startswith("state=silent"):
        proc = state.partition("proc=")[2].strip()
        return WorkerStacks(worker, silent=f"its job is {PROCESS_STATES.get(proc, proc or 'gone')}")
    if state == "state=starting":
        return WorkerStacks(worker, silent="its job is starting")
    if state == "state=no-py-spy":
        return WorkerStacks(worker, silent=NO_PY_SPY)
    if state.startswith("state=failed"):
        said = state.partition(" ")[2].strip()
        return WorkerStacks(worker, silent=f"py-spy could not read its job: {said or 'no reason given'}")
    if state == "state=ended":
        return WorkerStacks(worker, silent="its job has ended")
    if state == "state=missing":
        return WorkerStacks(worker, silent="no run folder")
    return WorkerStacks(worker, silent=error or "unreachable")


async def collect_stacks(providers: dict[str, Provider], record: RunRecord, wait_s: float = 5.0,
                         address: str = run_recipes.LIBTPU_METRICS_ADDRESS) -> RunStacks:
    """Every worker's stacks of `record`'s run, grouped, with libtpu's view of its chips; a UserError-free
    answer even for a node that is gone (every worker silent, saying why)."""
    async with reach_node(providers, record.node) as reached:
        if reached.fleet is None:
            return RunStacks(record.run_id, record.node, silent={w: reached.problem or "unreachable"
                                                                  for w in record.workers})
        py_spy = is_command_job(record)
        ask = (dump_stacks_py_spy(record.run_id, py_spy_places(record), wait_s) if py_spy
               else run_recipes.request_stacks(record.run_id, wait_s))
        results, devices = await asyncio.gather(
            reached.fleet.run(ask, record.workers, timeout=wait_s + 30),
            _device_state(reached, record.workers, address),
        )
    answers = [parse_answer(r.worker, r.stdout, r.error or (None if r.ok else r.stderr.strip()))
               for r in results]
    if py_spy:
        answers = [WorkerStacks(a.worker, dump=from_py_spy(a.dump)) if a.dump is not None else a
                   for a in answers]
    found = group(answers, record.run_id, record.node)
    found.devices = devices
    found.slice_of = worker_slices(getattr(record, "slices", 1), record.workers)
    return found


async def _device_state(reached: NodeWorkers, workers: list[int], address: str) -> list[WorkerDeviceMetrics]:
    """libtpu's metrics of each worker's chips, read with the trainer's interpreter there (not the run's
    own command, which may be any program)."""
    assert reached.fleet is not None and reached.provider is not None
    try:
        python = worker_python(reached.provider, await inspect_workers(reached.fleet, workers))
        return await read_device_metrics(reached.fleet, workers, python, address)
    except (UserError, Unreachable) as exc:
        return [WorkerDeviceMetrics(w, not_reported=one_line(exc)) for w in workers]


def _workers(workers: list[int]) -> str:
    return ("worker " if len(workers) == 1 else "workers ") + ",".join(str(w) for w in workers)


def _in_ranges(workers: list[int]) -> str:
    """`workers 0-3,5`: a multislice's workers as ranges (a slice may be 64 hosts)."""
    return ("worker " if len(workers) == 1 else "workers ") + _ranges(workers)


def _ranges(numbers: list[int]) -> str:
    """`0-3,5`: consecutive numbers as ranges (a slice of 64 hosts is one range, not 64 numbers)."""
    spans: list[list[int]] = []
    for n in sorted(numbers):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
