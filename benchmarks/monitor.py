"""Live run monitoring at pod scale: can the console keep up with 64 (or 256) workers' logs, in bounded
memory, and show a line soon after it is written?

    .venv/bin/python benchmarks/monitor.py [--workers 64] [--lines 20000] [--latency-s 6]
    .venv/bin/python benchmarks/monitor.py --workers 256 --lines 5000     # four v6e-256 slices' hosts

(a) throughput: every worker's job writes --lines log lines (~100 bytes, one events.jsonl step event per
    100 lines) as fast as it can; one RunWatch (tail + events parse + signatures + state, as `logs -f` and
    the TUI use it) reads them all. Prints lines/s over the wall time, and lines per second of the console
    process's own CPU time: "one core" is that second number (target >= 50,000), since on this 2-core
    machine the 64 writers and the pod's SSH servers take the other core and more. Every line is checked
    to have arrived exactly once.
(b) latency: every worker writes a timestamped line every 50 ms; once every worker's ticker is running
    (256 Python processes starting on the console's own 2 cores are a pod's start, not the console's),
    a watch at `logs -f`'s settings (each log from its last --first-lines lines, 50 as `logs -f`;
    `all`: from its beginning) starts, notes when each line reaches it, and runs --latency-s seconds.
    Prints p50/p95/max of the lines written while the worker is followed, how long until every
    worker's follower was streaming, and the p95 of every line written since the watch began, the first
    ones included (the target: p95 < 1 s); a line written since the watch began that never arrived
    (the log opened past it) counts as never, and is named. It also prints the CPU the start took: the
    console's own, per worker, and the simulated pod's (pod_host processes, agents, followers), which a
    real pod spends on its own hosts but here takes the same 2 cores.
    Each line's latency is split in two at its arrival on its connection (the moment the console's SSH
    layer is handed the bytes read from the worker's socket, asyncssh's `data_received`): before it, the
    simulated pod's share (the ticker's write, the follower's poll, the agent, the pod's SSH server, the
    socket), after it the console's own (decrypting, the command channel's frames, the follower's
    records, the watch, to `logs -f`'s callback). Target: the console's share under 100 ms at p95. Bytes
    that wait in the socket while the console's event loop is busy with something else are not in it;
    the loop's lag (how late a 20 ms timer fires, p95) is printed beside it as their bound.
Peak RSS of the console process is printed with the bytes read, and the ring buffers' size.
The reference, measured in the same run: reading and splitting the same log bytes from local files in
this process (no SSH, no parsing), the floor the console's cost is put against.

The pod's SSH servers run in separate `pod_host` processes, 64 workers each (as benchmarks/fanout.py does):
a real pod's sshd does not share the console's CPU. Uses a throwaway TPU_CONSOLE_HOME; nothing is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime

from pod_cpu import pod_cpu_s

LINES_PER_CPU_S_TARGET = 50_000
P95_TARGET_S = 1.0
CONSOLE_P95_TARGET_S = 0.100

WRITER = """
import json, sys, time
n = int(sys.argv[1])
pad = "x" * 70
out = sys.stdout
with open("events.jsonl", "a") as events:
    block = []
    for i in range(1, n + 1):
        block.append(f"step {i} loss=0.0123 reward_mean=0.5 {pad}")
        if i % 100 == 0:
            events.write(json.dumps({"t": time.time(), "kind": "step", "process": 0, "step": i,
                                     "time/train/step_s": 0.5}) + "\\n")
        if len(block) == 1000:
            out.write("\\n".join(block) + "\\n"); block = []
    if block:
        out.write("\\n".join(block) + "\\n")
"""

TICKER = """
import os, sys, time
end = time.time() + float(sys.argv[1])  # a safety net: the benchmark writes `stop` in the run folder
while time.time() < end and not os.path.exists("stop"):
    print(f"tick {time.time():.6f}", flush=True)
    time.sleep(0.05)
"""
TICKER_LIMIT_S = 600.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


async def _start_jobs(fleet, run_id: str, workers: list[int], script: str, args: list[str]) -> None:
    from tpu_console.fleet import run_recipes

    for result in await fleet.run(run_recipes.prepare_run_dir(run_id), workers, timeout=120):
        assert result.ok, result.stderr
    start = run_recipes.start_detached(run_id, sys.executable, ["-c", script, *args], {})
    for result in await fleet.run(start, workers, timeout=120):
        assert result.ok, result.stderr


async def _wait_until_writing(fleet, run_id: str, workers: list[int], limit_s: float = 300.0) -> float:
    """Seconds until every worker's job has written to its log (the tickers have started)."""
    started = time.perf_counter()
    check = f"test -s tpu-console/runs/{run_id}/output.log"
    waiting = list(workers)
    while waiting:
        if time.perf_counter() - started > limit_s:
            raise SystemExit(f"error: workers {waiting[:5]} wrote nothing within {limit_s:g} s")
        await asyncio.sleep(0.2)
        results = await fleet.run(check, waiting, timeout=60)
        waiting = [r.worker for r in results if not r.ok]
    return time.perf_counter() - started


def _stamp_arrivals() -> None:
    """Note on each SSH connection when bytes last arrived on it: asyncssh hands a connection what its
    socket read to `data_received`, which decrypts and dispatches every packet in it to the channels,
    down to the watch, before it returns."""
    from asyncssh.connection import SSHConnection

    received = SSHConnection.data_received

    def data_received(self, data, datatype=None):
        self.bench_arrived = time.time()
        return received(self, data, datatype)

    SSHConnection.data_received = data_received


async def _loop_lag(lags: list[float], every_s: float = 0.02) -> None:
    """How late a timer fires: how long anything ready (bytes on a socket) may wait for the event loop."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + every_s
        await asyncio.sleep(every_s)
        lags.append(loop.time() - due)


def _p(values: list[float], q: float) -> float:
    return values[int(q * (len(values) - 1))] if values else float("nan")


def _record(run_id: str, workers: list[int]):
    from tpu_console.history.store import RunRecord

    return RunRecord(run_id, "bench", "local", f"local-{len(workers)}x1", workers, "-", "-", [],
                     sys.executable, datetime.now(UTC))


async def main(workers: int, lines: int, latency_s: float, first_lines: int | None) -> int:
    # Imported here so TPU_CONSOLE_HOME (set below) is in place before anything reads it.
    from tpu_console.domain import CreateRequest
    from tpu_console.fleet.fleet import Fleet
    from tpu_console.history.run_id import new_run_id
    from tpu_console.observe.watch import LogLines, RunWatch
    from tpu_console.providers.local import LocalProvider
    from tpu_console.providers.local.pod_host import start_pod_hosts

    _stamp_arrivals()
    provider = LocalProvider()
    node = await provider.create(CreateRequest(name="bench", accelerator_type=f"local-{workers}x1"))
    # The pod's servers in processes of their own, 64 workers each: a real pod's sshds share neither the
    # console's CPU nor one event loop between hundreds of hosts.
    hosts = contextlib.AsyncExitStack()
    ports = await hosts.enter_async_context(start_pod_hosts(node.name, workers))
    ids = list(range(workers))
    try:
        async with Fleet(provider.targets_at(node, ports)) as fleet:
            await fleet.start_command_channels()  # as a console in use has them

            # (a) throughput
            run_id = new_run_id()
            await _start_jobs(fleet, run_id, ids, WRITER, [str(lines)])
            watch = RunWatch(fleet, _record(run_id, ids), poll_s=0.05)
            cpu0, t0 = _cpu_s(), time.perf_counter()
            await watch.run()
            wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
            got = sum(s.lines_total for s in watch.workers.values())
            events = sum(s.events_total for s in watch.workers.values())
            read_mib = sum(s.log.offset + s.events_cursor.offset for s in watch.workers.values()) / 2**20
            ring = sum(len(s.lines) for s in watch.workers.values())
            complete = got == workers * lines and events == workers * (lines // 100)
            rss = _peak_rss_mib()

            # the reference: the same bytes read and split locally
            t1 = time.perf_counter()
            local_lines = 0
            for w in ids:
                path = (provider.store.worker_dir(node.name, w) / "tpu-console" / "runs" / run_id
                        / "output.log")
                local_lines += len(path.read_bytes().decode().split("\n")) - 1
            reference = local_lines / (time.perf_counter() - t1)

            # (b) latency
            run_id = new_run_id()
            await _start_jobs(fleet, run_id, ids, TICKER, [str(TICKER_LIMIT_S)])
            tickers_started_s = await _wait_until_writing(fleet, run_id, ids)
            samples: list[tuple[int, float, float, float]] = []  # (worker, written at, latency, console's)
            first_seen: dict[int, float] = {}  # when each worker's first line arrived: it is followed since

            start_cpu: dict[str, float] = {}  # the CPU the start took, until every worker's first line

            def on_update(update) -> None:
                if isinstance(update, LogLines):
                    now = time.time()
                    arrived = getattr(fleet.connection(update.worker)._conn, "bench_arrived", now)
                    if update.worker not in first_seen:
                        first_seen[update.worker] = now
                        if len(first_seen) == workers:
                            start_cpu["console"] = _cpu_s() - cpu_b0
                            start_cpu["pod"] = pod_cpu_s() - pod_b0
                    for line in update.lines:
                        if line.startswith("tick "):
                            written = float(line.split()[1])
                            samples.append((update.worker, written, now - written, now - arrived))

            pod_b0 = pod_cpu_s()
            watch_started, cpu_b0 = time.time(), _cpu_s()
            watch = RunWatch(fleet, _record(run_id, ids), first_log_lines=first_lines)  # logs -f's settings
            watching = asyncio.ensure_future(watch.run(on_update))
            lags: list[float] = []
            lag_task = asyncio.ensure_future(_loop_lag(lags))
            await asyncio.sleep(latency_s)
            lag_task.cancel()
            for result in await fleet.run(f"touch tpu-console/runs/{run_id}/stop", ids, timeout=120):
                assert result.ok, result.stderr
            await watching
            wall_b, cpu_b = time.time() - watch_started, _cpu_s() - cpu_b0
            # every line written since the watch began, from the logs themselves: any that never arrived?
            received = {(worker, written) for worker, written, _, _ in samples}
            never = []
            for w in ids:
                log = (provider.store.worker_dir(node.name, w) / "tpu-console" / "runs" / run_id
                       / "output.log").read_text()
                for line in log.splitlines():
                    if line.startswith("tick ") and (written := float(line.split()[1])) >= watch_started:
                        if (w, written) not in received and written < watch_started + latency_s - 1.0:
                            never.append((w, written))
    finally:
        await hosts.aclose()
        await provider.close()

    # Line latency is that of lines written while the watch follows the worker (its first line has come):
    # lines written before wait for the follower to start, shown apart too. On a real pod each worker starts
    # its follower on its own host; here they all start on the console's 2 cores at once.
    latencies = sorted(lat for worker, written, lat, _ in samples if written >= first_seen[worker])
    starting = sorted(lat for worker, written, lat, _ in samples
                      if watch_started <= written < first_seen[worker])
    since_start = [(lat, console) for _, written, lat, console in samples if written >= watch_started]
    console_added = sorted(console for _, console in since_start)
    pod_share = sorted(lat - console for lat, console in since_start)
    lags.sort()
    first_line_s = sorted(t - watch_started for t in first_seen.values())
    p50 = statistics.median(latencies) if latencies else float("nan")
    p95 = latencies[int(0.95 * (len(latencies) - 1))] if latencies else float("nan")
    per_cpu_s = got / cpu if cpu > 0 else float("inf")
    print(f"workers: {workers}, lines per worker: {lines:,}, log and events read: {read_mib:.1f} MiB")
    print(f"(a) throughput: {got:,} lines + {events:,} events in {wall:.2f} s: "
          f"{got / wall:,.0f} lines/s wall; "
          f"console CPU {cpu:.2f} s: {per_cpu_s:,.0f} lines per CPU-second; every line once: {complete}")
    print(f"    peak RSS {rss:.0f} MiB (ring buffers hold {ring:,} lines; the logs were {read_mib:.1f} MiB)")
    print(f"    reference, the same logs read and split locally: {reference:,.0f} lines/s; "
          f"ratio reference/console-CPU {reference / per_cpu_s:.1f}x")
    print(f"(b) latency, written -> received: {len(latencies):,} lines, p50 {p50 * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms, max {latencies[-1] * 1000 if latencies else float('nan'):.0f} ms "
          f"(lines written while followed)")
    every = sorted(latencies + starting) + [float("inf")] * len(never)
    p95_all = every[int(0.95 * (len(every) - 1))] if every else float("nan")
    if first_line_s:
        print(f"    start: the {workers} tickers were all writing {tickers_started_s:.1f} s after they were "
              f"launched; then every worker's first line arrived within {first_line_s[-1] * 1000:.0f} ms "
              f"of the watch's start (median {statistics.median(first_line_s) * 1000:.0f} ms; "
              f"{workers} followers starting); the {len(starting):,} lines written meanwhile arrived within "
              f"{starting[-1] * 1000 if starting else 0:.0f} ms")
        print(f"    every line written since the watch began, the start included: "
              f"p95 {p95_all * 1000:.0f} ms ({len(every):,} lines; never arrived: {len(never)}"
              f"{f', e.g. worker {never[0][0]}' if never else ''})")
    console_p95 = _p(console_added, 0.95)
    print(f"    split at each line's arrival on its connection (every line since the watch began, the start "
          f"included): the console's share, arrival -> `logs -f`'s callback, p50 "
          f"{_p(console_added, 0.5) * 1000:.2f} ms, p95 {console_p95 * 1000:.2f} ms, max "
          f"{_p(console_added, 1.0) * 1000:.1f} ms; the simulated pod's, written -> arrival, p50 "
          f"{_p(pod_share, 0.5) * 1000:.0f} ms, p95 {_p(pod_share, 0.95) * 1000:.0f} ms, max "
          f"{_p(pod_share, 1.0) * 1000:.0f} ms; the console's event loop late by p50 "
          f"{_p(lags, 0.5) * 1000:.1f} ms, p95 {_p(lags, 0.95) * 1000:.1f} ms, "
          f"max {_p(lags, 1.0) * 1000:.0f} ms "
          f"(what waits unread on a socket meanwhile)")
    if start_cpu and first_line_s:
        console_s, pod_s = start_cpu["console"], start_cpu["pod"]
        print(f"    the start's CPU, until every worker's first line: the console's {console_s:.2f} s "
              f"({console_s / workers * 1000:.2f} ms per worker, lines included), the simulated pod's "
              f"{pod_s:.2f} s (pod_host processes, agents, followers: a real pod's own hosts); over the "
              f"{first_line_s[-1]:.2f} s the start took, the console got {console_s / first_line_s[-1]:.0%} "
              f"of a core, the two {(console_s + pod_s) / first_line_s[-1]:.2f} of the 2")
    print(f"    the console's CPU while following: {cpu_b:.2f} s in {wall_b:.1f} s, {cpu_b / wall_b:.0%} of "
          f"one core (load average {os.getloadavg()[0]:.1f}: the console gets a share of it)")
    met = (per_cpu_s >= LINES_PER_CPU_S_TARGET and p95_all < P95_TARGET_S and complete and not never
           and console_p95 < CONSOLE_P95_TARGET_S)
    print(f"targets: >= {LINES_PER_CPU_S_TARGET:,} lines per console CPU-second, p95 < {P95_TARGET_S:g} s "
          f"(the first lines included), the console's share p95 < {CONSOLE_P95_TARGET_S * 1000:g} ms, "
          f"no line lost: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--lines", type=int, default=20000, help="log lines each worker writes in (a)")
    parser.add_argument("--latency-s", type=float, default=6.0, help="seconds of watching in (b)")
    parser.add_argument("--first-lines", default="50",
                        help="(b) opens each log at its last N lines, as `logs -f` (50); `all`: from 0")
    options = parser.parse_args()
    first = None if options.first_lines == "all" else int(options.first_lines)
    home = tempfile.mkdtemp(prefix="tpc-bench-monitor-")
    os.environ["TPU_CONSOLE_HOME"] = home
    try:
        sys.exit(asyncio.run(main(options.workers, options.lines, options.latency_s, first)))
    finally:
        shutil.rmtree(home, ignore_errors=True)
