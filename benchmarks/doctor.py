"""The pod doctor's measure: on a local pod, each fault put in one at a time, then clean runs for false
alarms, then the doctor's time as the pod grows.

    .venv/bin/python benchmarks/doctor.py [--workers 8] [--clean 20] [--scale 4,8,16,32] [--out FILE]

Faults (tests/console/doctor/faults.py puts them in; docs/doctor.md says how each is found):
  slow host        the victim's check stopped in bursts (SIGSTOP 0.4 s, SIGCONT 0.1 s) for the whole check
  fewer devices    the victim's worker restarted with 1 CPU device where its peers have 2
  blocked port     the coordinator named at an address no worker reaches (packets dropped, as by a firewall)
  wrong chip       the check's test hook: the victim's chip 1 returns a matmul off by one
  never enters     the check's test hook: the victim never enters the first collective (--stall 10)
For each: found (a finding of that kind), the host named right (its workers are exactly the victim; the chip
too for a chip; the coordinator's worker 0 for the port), and the seconds from the doctor's start to its
report. Then --clean runs with no fault: any finding is a false alarm. Precision: right findings over all
findings; recall: faults found with the right host over faults put in.

--scale times a clean doctor on pods of 1 CPU device a worker at each size, as long as each takes under
--scale-limit seconds (the target at 256 workers is 60 s); every worker is a JAX process on this machine's
cores, so the size reached says what this machine allows, not what a pod of real hosts needs. Beside each
time, the floor a sceptical reader would pick: the seconds to run as many `python -c 'import jax'` (at most
--floor-at-once together), measured just before; the CPU seconds the workers' processes took against the
floor's; the memory the check took at its peak; and when the slowest worker had JAX imported, had joined,
had checked its chips and was done. A size whose processes would not fit this machine's available memory
is named and not run.

Prints the table and saves it, the command on top, to --out (benchmarks/results/doctor_DATE.txt).
Uses a throwaway TPU_CONSOLE_HOME; nothing is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAULT_ENV = "TPU_CONSOLE_DOCTOR_FAULT"


async def one_check(provider, name: str, **options):
    from tpu_console.doctor import check_node

    return await check_node({"local": provider}, name, **options)


async def run_fault(provider, pod, kind: str, victim: int) -> dict:
    """Put the fault in, run the doctor, take the fault out; what it found."""
    from tests.console.doctor.faults import StopInBursts, block_coordinator, expose_devices

    options: dict = {}
    want_kind, want_workers, want_chip = kind, (victim,), None
    if kind == "wrong chip":
        os.environ[FAULT_ENV] = f"wrong-result:{victim}:1"
        want_kind, want_chip = "chip", 1
    elif kind == "never enters":
        os.environ[FAULT_ENV] = f"never-enters:{victim}"
        want_kind, options = "collective", {"stall_s": 10.0}
    elif kind == "fewer devices":
        await expose_devices(provider, pod.name, victim, 1)
        want_kind = "devices"
    elif kind == "blocked port":
        block_coordinator(provider, 45999)
        want_kind, want_workers = "port", (0,)
    try:
        if kind == "slow host":
            want_kind = "host"
            with StopInBursts(provider.store.worker_dir(pod.name, victim)):
                report = await one_check(provider, pod.name, **options)
        else:
            report = await one_check(provider, pod.name, **options)
    finally:
        os.environ.pop(FAULT_ENV, None)
        if kind == "fewer devices":
            await expose_devices(provider, pod.name, victim, pod.shape.devices_per_worker)
        if kind == "blocked port":
            del provider.coordinator_env  # the class's own again
    right = [f for f in report.findings if f.kind == want_kind and f.workers == want_workers
             and (want_chip is None or f.chip == want_chip)]
    found = any(f.kind == want_kind for f in report.findings)
    return {"fault": kind, "victim": victim, "found": found, "named_right": bool(right),
            "seconds": report.seconds, "findings": len(report.findings), "right": len(right),
            "line": report.findings[0].line if report.findings else "(no finding)"}


async def measure(workers: int, clean: int, scale: list[int], scale_limit: float, faults: bool = True,
                  floor_at_once: int = 64) -> list[str]:

    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    if faults:
        await fault_table(workers, clean, say)
    if scale:
        await scale_table(scale, scale_limit, say, floor_at_once)
    return lines


async def fault_table(workers: int, clean: int, say) -> None:
    from tpu_console.domain import CreateRequest
    from tpu_console.providers.local import LocalProvider

    provider = LocalProvider()
    pod = await provider.create(CreateRequest(name="doc", accelerator_type=f"local-{workers}x2"))
    await provider.ssh_targets(pod)
    victim = workers // 2 + 1
    say(f"faults on a {workers}-worker local pod (2 CPU devices a worker), victim worker {victim}")
    say(f"{'FAULT':<14} {'FOUND':<6} {'HOST RIGHT':<11} {'SECONDS':>8}  FINDING")
    rows = []
    try:
        for kind in ("slow host", "fewer devices", "blocked port", "wrong chip", "never enters"):
            row = await run_fault(provider, pod, kind, victim)
            rows.append(row)
            found, named = ("yes" if row[k] else "NO" for k in ("found", "named_right"))
            say(f"{kind:<14} {found:<6} {named:<11} {row['seconds']:>8.1f}  {row['line'][:150]}")
        alarms, clean_seconds = [], []
        for i in range(clean):
            report = await one_check(provider, pod.name)
            clean_seconds.append(report.seconds)
            if report.findings:
                alarms.append(report.findings)
                say(f"clean run {i + 1}: FALSE ALARM: {report.findings[0].line[:160]}")
        findings = sum(r["findings"] for r in rows) + sum(len(a) for a in alarms)
        right = sum(r["right"] for r in rows)
        recall = sum(r["named_right"] for r in rows) / len(rows)
        precision = right / findings if findings else 1.0
        say()
        say(f"clean runs: {clean}, false alarms: {len(alarms)} (target 0); seconds per clean run: median "
            f"{sorted(clean_seconds)[len(clean_seconds) // 2]:.1f}, max {max(clean_seconds):.1f}"
            if clean_seconds else "clean runs: 0")
        say(f"precision {precision:.0%} ({right} right of {findings} findings), recall {recall:.0%} "
            f"({sum(r['named_right'] for r in rows)} of {len(rows)} faults found with the right host); "
            "target 100% both")
    finally:
        await provider.delete(pod.name)
        await provider.close()


async def scale_table(scale: list[int], scale_limit: float, say, floor_at_once: int) -> None:
    from tpu_console.domain import CreateRequest
    from tpu_console.providers.local import LocalProvider

    say()
    say(f"doctor on N simulated workers (1 CPU device each, every worker a JAX process on this machine's "
        f"{os.cpu_count()} cores and {_memory_gb('MemTotal'):.0f} GB); target 256 within 60 s")
    say(f"floor: N `python -c '{FLOOR_PROGRAM}'` ({floor_at_once} at a time at most), timed just before the "
        "doctor; CPU: what the workers' processes (or the floor's) used, from this process's children")
    say(f"{'WORKERS':>8} {'DOCTOR_S':>9} {'FLOOR_S':>8} {'CPU_S':>6} {'FLOOR_CPU':>9} {'MEM_GB':>6} "
        f"{'LOAD':>10}  PHASES (s from the doctor's start, slowest worker)  OUTCOME")
    per_worker_gb = 0.0  # measured at the size before
    for size in scale:
        load_before = os.getloadavg()[0]
        floor_s, floor_cpu = await import_floor(size, floor_at_once)
        need_gb, available_gb = size * per_worker_gb, _memory_gb("MemAvailable")
        if available_gb < need_gb * 1.25:
            say(f"{size:>8} {'-':>9} {floor_s:>8.1f} {'-':>6} {floor_cpu:>9.0f} {'-':>6} "
                f"{load_before:>6.0f}->{os.getloadavg()[0]:.0f}  the doctor not run: its {size} checks "
                f"would take about {need_gb:.0f} GB ({per_worker_gb * 1024:.0f} MB a worker at the size "
                f"before) and {available_gb:.0f} GB is available; it would push this shared machine's other "
                "work out of memory")
            continue
        provider = LocalProvider()
        pod = await provider.create(CreateRequest(name=f"scale{size}", accelerator_type=f"local-{size}x1"))
        await provider.ssh_targets(pod)
        memory = MemoryLow()
        try:
            cpu_before, started, wall_started = _children_cpu(), time.monotonic(), time.time()
            with memory:
                report = await one_check(provider, pod.name, deadline_s=scale_limit, stall_s=scale_limit)
            seconds = time.monotonic() - started
        finally:
            await provider.delete(pod.name)
            await provider.close()
        cpu = _children_cpu() - cpu_before  # the workers' processes, reaped by the time their servers stop
        per_worker_gb = memory.used_gb / size
        outcome = "healthy" if report.ok else f"{len(report.findings)} finding(s), the first below"
        load = f"{load_before:.0f}->{os.getloadavg()[0]:.0f}"
        say(f"{size:>8} {seconds:>9.1f} {floor_s:>8.1f} {cpu:>6.0f} {floor_cpu:>9.0f} {memory.used_gb:>6.1f} "
            f"{load:>10}  {phases(report, wall_started)}  {outcome}")
        if not report.ok:
            say(f"{'':>8} finding: {report.findings[0].line}")
        if seconds > scale_limit:
            say(f"stopped at {size}: past {scale_limit:g}s")
            break


FLOOR_PROGRAM = "import jax, os; os._exit(0)"  # as the check exits: the interpreter's teardown of JAX's
# modules would add about 0.3 CPU-s a process, which the check does not pay


async def import_floor(count: int, at_once: int) -> tuple[float, float]:
    """Seconds to run `count` Pythons that import JAX (at most `at_once` together), and their CPU seconds."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    slots = asyncio.Semaphore(at_once)

    async def one() -> None:
        async with slots:
            # a session of its own, as the local pod starts each worker's command (the scheduler shares the
            # cores between sessions first: 64 processes in one session would get one session's share)
            process = await asyncio.create_subprocess_exec(sys.executable, "-c", FLOOR_PROGRAM, env=env,
                                                           start_new_session=True)
            await process.wait()

    cpu_before, started = _children_cpu(), time.monotonic()
    await asyncio.gather(*(one() for _ in range(count)))
    return time.monotonic() - started, _children_cpu() - cpu_before


def phases(report, t0: float) -> str:
    """When the slowest worker had its program up (JAX imported), joined the others, checked its chips,
    and ended, in seconds from the doctor's start (`t0`, this machine's clock: the workers' too)."""
    figures = [f for f in report.workers if f.devices is not None]
    if not figures:
        return "no worker reached its devices line"

    def last(values) -> str:
        values = list(values)
        return f"{max(values) - t0:.0f}" if values else "-"

    def median_sum(key: str) -> float:
        sums = [sum(float(c.get(key, 0.0)) for c in f.collectives.values()) for f in figures]
        return statistics.median(sums) if sums else 0.0

    return (f"up {last(float(f.devices['t']) - float(f.devices['joined_s']) for f in figures)}, "
            f"joined {last(float(f.devices['t']) for f in figures)}, "
            f"chips {last(float(f.chips[-1]['t']) for f in figures if f.chips)}, "
            f"done {last(float(f.done['t']) for f in figures if f.done)} (a worker's collectives: compiles "
            f"{median_sum('compile_s'):.0f}, first runs {median_sum('first_s'):.0f}, timed runs' medians "
            f"{median_sum('seconds'):.1f}, the median worker)")


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _memory_gb(field: str) -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    return 0.0


class MemoryLow:
    """The most memory taken while it is entered: MemAvailable's drop from its value at the start."""

    def __init__(self) -> None:
        import threading

        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.used_gb = 0.0

    def _watch(self) -> None:
        start = _memory_gb("MemAvailable")
        while not self._stop.wait(0.5):
            self.used_gb = max(self.used_gb, start - _memory_gb("MemAvailable"))

    def __enter__(self) -> MemoryLow:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8, help="the fault pod's workers, 4-16 (8)")
    parser.add_argument("--clean", type=int, default=20, help="clean runs for false alarms (20)")
    parser.add_argument("--scale", default="4,8,16,32", help="pod sizes for the timing, comma list ('' none)")
    parser.add_argument("--skip-faults", action="store_true", help="only the timing (--scale)")
    parser.add_argument("--scale-limit", type=float, default=180.0, help="stop growing past this (180 s)")
    parser.add_argument("--floor-at-once", type=int, default=64,
                        help="the floor's `import jax` processes running together at most (64)")
    parser.add_argument("--out", default=None,
                        help="where the table goes (benchmarks/results/doctor_DATE.txt)")
    args = parser.parse_args()
    if not 4 <= args.workers <= 16:
        print("error: --workers is 4 to 16", file=sys.stderr)
        return 2
    scale = [int(s) for s in args.scale.split(",") if s.strip()]
    home = tempfile.mkdtemp(prefix="tpu-console-doctor-")
    os.environ["TPU_CONSOLE_HOME"] = home
    started = datetime.now(UTC)
    try:
        lines = asyncio.run(measure(args.workers, args.clean, scale, args.scale_limit, not args.skip_faults,
                                    args.floor_at_once))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"doctor_{started:%Y-%m-%d}.txt")
    command = " ".join([".venv/bin/python benchmarks/doctor.py", *map(shlex.quote, sys.argv[1:])])
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    out.write_text(f"$ {command}\n# {started:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, load average at "
                   f"the end {load} (1/5/15 min; the machine is shared)\n\n"
                   + "\n".join(lines) + "\n")
    print(f"saved {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
