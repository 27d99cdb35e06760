"""The doctor's run on a node: every worker at once, then the figures judged (findings.py).

1. The node looked up and every worker connected (one that is not is a finding, and the check stops there).
2. The ports a job's hosts reach each other on, as `launch` checks them (fleet/port_check.py): a port that
   does not pass stops the check (JAX could not join).
3. The check program (worker/doctor_check.py) uploaded to `~/tpu-console/doctor/ID/` and started on every
   worker with the environment a job gets to join the others (launch/start.py `launch_env`), under `timeout`;
   its `doctor {json}` lines are read as they come.
4. It ends when every worker's program has ended; or, once one has entered the first collective, when no
   worker printed anything for `stall_s` (a collective some never entered: the others wait there forever);
   or at `deadline_s`. Then every program is stopped (its process group killed) and the figures so far are
   judged.

`check_node` is what `tpu-console doctor NODE`, `launch --check` and the managed-run controller call.
TPU_CONSOLE_DOCTOR_FAULT in the console's environment is passed to the workers (the check's test hook,
worker/doctor_check.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tpu_console import worker
from tpu_console.doctor.expected import expected as expected_times
from tpu_console.doctor.findings import Expected, Finding, Pod, WorkerFigures, judge
from tpu_console.domain import Node
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.port_check import problem_line, unreachable_ports
from tpu_console.fleet.preflight import open_node, unreachable_workers
from tpu_console.fleet.results import WorkerLine
from tpu_console.fleet.run_recipes import python_word
from tpu_console.history.run_id import new_run_id
from tpu_console.launch import job_ports
from tpu_console.launch.start import launch_env
from tpu_console.providers.base import Provider
from tpu_console.provision.worker_recipes import ENV_PYTHON

PROGRAM = "doctor_check.py"
PROGRAM_SOURCE = worker.source(PROGRAM)
DOCTOR_DIR = "tpu-console/doctor"  # relative to the worker's home: one folder per check
FAULT_ENV = "TPU_CONSOLE_DOCTOR_FAULT"
# Bytes a chip per all-reduce, and the memory pattern's. On a TPU: enough for the bandwidth to show over the
# fixed costs. A local pod's CPU devices have no interconnect to price and share this machine's memory with
# every other worker: a small payload (its collectives are judged by the bisection alone) and pattern.
TPU_PAYLOAD, TPU_HBM_BYTES = 64 << 20, 16 << 20
LOCAL_PAYLOAD, LOCAL_HBM_BYTES = 64 << 10, 1 << 20
STALL_S = 30.0
DEADLINE_S = 300.0


@dataclass
class DoctorReport:
    node: str
    accelerator_type: str
    workers: list[WorkerFigures]
    findings: list[Finding]
    expected: Expected
    seconds: float
    stopped: str | None = None  # why the console stopped the programs, when it did
    ports: list[str] = field(default_factory=list)  # the port check's lines (empty: passed)

    @property
    def ok(self) -> bool:
        return not self.findings

    def lines(self) -> list[str]:
        """The findings, one line each; or what passed."""
        if self.findings:
            return [f.line for f in self.findings]
        chips = sum(len(f.chips) for f in self.workers)
        rings = sorted({n for f in self.workers for n in f.collectives if not n.startswith("group:")})
        priced = f", timed against {self.expected.source}" if self.expected.seconds else ""
        return [f"{self.node}: {len(self.workers)} worker(s), {chips} chip(s) answered right; ports reached; "
                f"all-reduce {', '.join(rings) or 'none (one host)'} and the bisection groups ran{priced} "
                f"({self.seconds:.1f}s)"]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "accelerator_type": self.accelerator_type, "ok": self.ok,
                "seconds": self.seconds, "stopped": self.stopped,
                "findings": [f.to_json() for f in self.findings],
                "expected": {"source": self.expected.source, "seconds": dict(self.expected.seconds)},
                "workers": [f.to_json() for f in self.workers]}


def start_command(check_dir: str, python: str, args: list[str], deadline_s: float) -> str:
    """bash on a worker: record this shell's pid (the check's process group, which `timeout` leads), then
    the check under `timeout`, its stderr in the check's folder."""
    folder = f'"$HOME"/{shlex.quote(check_dir)}'
    words = " ".join(shlex.quote(a) for a in args)
    return (f"cd {folder} || exit 3; echo $$ > pid; exec timeout -s KILL {deadline_s:g} "
            f"{python_word(python)} -u {PROGRAM} {words} 2> stderr.txt")


def stop_command(check_dir: str) -> str:
    """bash: kill the check's process group on this worker (nothing when it has ended)."""
    folder = f'"$HOME"/{shlex.quote(check_dir)}'
    return f'p=$(cat {folder}/pid 2>/dev/null) && kill -KILL -- "-$p" 2>/dev/null; true'


def default_python(node: Node) -> str:
    """This interpreter on a local pod (its workers are this machine); bootstrap's environment elsewhere."""
    return sys.executable if node.provider == "local" else ENV_PYTHON


async def check_node(
    providers: dict[str, Provider],
    node_name: str,
    *,
    python: str | None = None,
    payload_bytes: int | None = None,
    reps: int = 3,
    stall_s: float = STALL_S,
    deadline_s: float = DEADLINE_S,
    progress: Callable[[str], None] = lambda _: None,
) -> DoctorReport:
    """Check every worker of `node_name` (see the module docstring); the report, never raising for what
    it finds on the node (UserError only for a node that is unknown or not READY)."""
    started = time.monotonic()
    provider, node = await open_node(providers, node_name)
    pod = Pod(node.name, node.shape.devices_per_worker, node.slices, node.provider)
    targets = await provider.ssh_targets(node)
    workers = [t.worker for t in targets]
    figures = [WorkerFigures(w, node.slice_of(w) if node.slices > 1 else 0) for w in workers]
    by_worker = {f.worker: f for f in figures}
    local = node.provider == "local"
    payload = payload_bytes or (LOCAL_PAYLOAD if local else TPU_PAYLOAD)
    hosts_per_slice = max(1, len(workers) // node.slices)
    want = expected_times(node.accelerator_type, node.slices, hosts_per_slice, node.shape.devices_per_worker,
                          payload)

    def report(findings: list[Finding], stopped: str | None = None, ports: list[str] | None = None):
        return DoctorReport(node.name, node.accelerator_type, figures, findings, want,
                            time.monotonic() - started, stopped, ports or [])

    async with Fleet(targets) as fleet:
        progress(f"{node.name}: connecting to {len(workers)} worker(s)")
        failed = await unreachable_workers(fleet, workers)
        for w, why in failed.items():
            by_worker[w].error = f"unreachable: {why}"
        if failed:
            return report(judge(pod, figures, want))
        envs = launch_env(provider, node, fleet, workers, command=True)
        if len(workers) > 1:
            progress(f"{node.name}: the coordinator's and megascale's ports")
            first = workers[0]
            known = next((w for w in node.workers if w.index == first), None)
            first_host = known.internal_ip if known and known.internal_ip else fleet.targets[first].host
            needs = job_ports.job_ports(node, envs[first], first, first_host)
            problems = await unreachable_ports(fleet, needs, workers)
            if problems:
                line = problem_line(node, problems, "the chips were not checked")
                listeners = tuple(sorted({p.need.listener for p in problems}))  # the port's host
                return report([Finding("port", listeners, line)], ports=[line])
        check_dir = f"{DOCTOR_DIR}/{new_run_id()}"
        progress(f"{node.name}: the check on every worker ({check_dir})")
        made = await fleet.run(f"mkdir -p \"$HOME\"/{shlex.quote(check_dir)}", workers, timeout=60)
        uploads = await fleet.put(PROGRAM_SOURCE, f"{check_dir}/{PROGRAM}", workers, mode=0o644)
        for result in [*made, *uploads]:
            if not result.ok:
                by_worker[result.worker].error = result.error or result.stderr.strip() or "upload failed"
        if any(f.error for f in figures):
            return report(judge(pod, figures, want))
        args = ["--bytes", str(payload), "--hbm-bytes", str(LOCAL_HBM_BYTES if local else TPU_HBM_BYTES),
                "--reps", str(reps), "--slices", str(node.slices),
                "--hosts-per-slice", str(hosts_per_slice)]
        stopped = await _run_checks(fleet, node, figures, envs, check_dir, python or default_python(node),
                                    args, stall_s, deadline_s)
        if stopped:
            progress(f"{node.name}: {stopped}; stopping the check on every worker")
            await fleet.run(stop_command(check_dir), workers, timeout=30)
    findings = judge(pod, figures, want)
    if stopped and not findings:  # stuck, but not where one worker stayed away from the others
        waiting = [f.worker for f in figures if f.stopped]
        findings = [Finding("stalled", tuple(waiting), f"the check on {node.name!r} stopped: {stopped}, with "
                            f"worker(s) {','.join(map(str, waiting))} unfinished (the last each reached: "
                            f"{_last_reached(figures)}): {pod.recreate}, or report the hosts")]
    return report(findings, stopped)


def _last_reached(figures: list[WorkerFigures]) -> str:
    places: dict[str, list[int]] = {}
    for f in figures:
        if f.stopped:
            places.setdefault(f.entered[-1] if f.entered else "its start", []).append(f.worker)
    return "; ".join(f"{where}: {','.join(map(str, ws))}" for where, ws in places.items())


async def _run_checks(fleet: Fleet, node: Node, figures: list[WorkerFigures], envs: dict[int, dict[str, str]],
                      check_dir: str, python: str, args: list[str], stall_s: float,
                      deadline_s: float) -> str | None:
    """The check on every worker at once, its lines into `figures`; why it was stopped, or None."""
    by_worker = {f.worker: f for f in figures}
    last_line = [time.monotonic()]

    def on_line(line: WorkerLine) -> None:
        word, _, rest = line.text.partition(" ")
        if line.stream != "stdout" or word != "doctor":
            return
        with contextlib.suppress(ValueError):
            record = json.loads(rest)
            if isinstance(record, dict):
                by_worker[line.worker].add(record)
                last_line[0] = time.monotonic()

    fault = os.environ.get(FAULT_ENV)
    count = len(figures)

    async def one(f: WorkerFigures) -> None:
        env = {**envs.get(f.worker, {}), "TPU_CONSOLE_WORKER": str(f.worker),
               "TPU_CONSOLE_WORKER_COUNT": str(count)}
        if fault:
            env[FAULT_ENV] = fault
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
        result = await fleet.follow(exports + start_command(check_dir, python, args, deadline_s), f.worker,
                                    on_line)
        if f.done is None and f.error is None:
            said = await _stderr_tail(fleet, f.worker, check_dir)
            f.error = (result.error or said or f"the check exited {result.exit_status} before its end")

    tasks = {asyncio.ensure_future(one(f)) for f in figures}
    started = time.monotonic()
    stopped = None
    try:
        while tasks:
            done, tasks = await asyncio.wait(tasks, timeout=1.0)
            now = time.monotonic()
            entered = any(f.entered for f in figures)  # joining and compiling print nothing for long
            if tasks and entered and now - last_line[0] > stall_s:
                stopped = f"no worker made progress for {stall_s:g}s"
            elif tasks and now - started > deadline_s:
                stopped = f"the check ran past its {deadline_s:g}s"
            if stopped:
                break
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if stopped:
        for f in figures:
            if f.done is None:
                f.stopped = True
    return stopped


async def _stderr_tail(fleet: Fleet, worker_index: int, check_dir: str) -> str:
    """The last line the check wrote to its stderr on that worker ('' when none)."""
    (result,) = await fleet.run(f"tail -n 5 \"$HOME\"/{shlex.quote(check_dir)}/stderr.txt 2>/dev/null",
                                [worker_index], timeout=30)
    lines = [line for line in result.stdout.splitlines() if line.strip() and "Gloo" not in line]
    return lines[-1].strip() if lines else ""
