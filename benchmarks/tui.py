"""Key press to rendered frame in the run dashboard, with and without a heavy log stream.

    .venv/bin/python benchmarks/tui.py [--workers 64] [--lines-per-s 10000] [--presses 60]

Runs the real app (TpuConsoleApp with the RunScreen on top) in a pseudo-terminal of 100x30, as a person
would see it, and types worker numbers into it: `1`, `2`, `1`, ... Each key changes the log's status
line to "log: worker N"; the time from writing the key to the terminal until those bytes come out of it
is one measurement (input parsing, the key binding, the widgets' updates, the compositor and the write).

Two runs in this same invocation: idle (the dashboard shows a run but nothing new arrives: no line, no
event, only each worker's follower's heartbeat, once a second, as on a real pod) and loaded (`--workers`
workers whose logs grow by `--lines-per-s` lines per second in total, and a step event per worker every
2 s). The load enters through the dashboard's real intake: a `RunWatch` taking every worker's follower
records (parsed, the byte offsets, masking, log signatures, events, the health) inside `RunFeed`, in the
app's process; only the transport is synthetic (`SyntheticPod` streams the bytes written since the offset
asked for, every `poll_s`, as a worker's follower would), so what is timed is the dashboard, not the pod.
The synthetic pod runs in the app's process: its CPU (writing the files, one pump sending every worker's
records, the benchmark's own timing of the lines) is counted apart and printed beside the app's own, and
the app's CPU per 10,000 lines taken in (what a second of the asked-for stream costs it, whatever share of
a core a loaded machine gave it).

Each log line's arrival (the pod hands its record to the watch, as a connection would) and its delivery
to the log pane are timed: the latency the console adds, p50/p95 (target: p95 under 100 ms), beside the
pod's share (written -> arrival: the follower's poll).
Targets (issues 11, 38): key to frame median under 100 ms under load; the console's latency p95 < 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import fcntl
import json
import os
import pty
import random
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MEDIAN_S = 0.100
TARGET_CONSOLE_P95_S = 0.100
COLUMNS, ROWS = 100, 30


# -- the app side (child process) ------------------------------------------------------------------------


class SyntheticPod:
    """Stands in for the Fleet of a pod whose workers' output.log and events.jsonl grow by the clock.

    `follow(command, worker, on_line)` streams each file's new bytes and the job's state as a worker's
    follower does (worker/run_follower.py's records), so everything from the records on is the watch's own
    code. One pump sends the records (a real pod's followers poll on their own hosts; here a coroutine per
    worker would time the pod, not the console): each worker's every `poll_s`, the workers in PHASES groups
    whose turns are spread over the interval, as independent followers' polls are, not all in the same
    millisecond. It starts at the watch's
    cursors (what the follower is told); bytes before them are dropped, so memory stays small however
    long it runs. `cpu_s` is the CPU its own work took in this process (writing, pumping), not the watch's."""

    def __init__(self, run_id: str, workers: int, lines_per_s: int, step_every_s: float | None = 2.0) -> None:
        self.run_id = run_id
        self.workers = list(range(workers))
        self.lines_per_s = lines_per_s
        self.step_every_s = step_every_s
        self.files = {(w, name): bytearray() for w in self.workers for name in ("output.log", "events.jsonl")}
        self.dropped = dict.fromkeys(self.files, 0)  # bytes dropped from the start of each file
        self.lines_written = 0
        self.step = 0
        self.watch = None  # the RunWatch that follows, set once it exists
        self.started = time.monotonic()
        self.followers: dict[int, tuple[object, dict[str, int]]] = {}  # worker: (on_line, offsets)
        self.grown: set[int] = set()  # workers whose files grew since the pump last looked
        self.written_at: dict[int, float] = {}  # line number: when it was written (monotonic)
        self.arrived_at: dict[int, float] = {}  # line number: when its record reached the watch
        self.cpu_s = 0.0

    async def write(self) -> None:
        """Append log lines at `lines_per_s` (round-robin over the workers) and a step event per worker
        every `step_every_s`, by the clock, until cancelled."""
        self.started = owed_since = time.monotonic()
        owed, last, next_step = 0.0, owed_since, owed_since
        while True:
            cpu = time.thread_time()
            now = time.monotonic()
            if self.step_every_s is not None and now >= next_step:
                next_step += self.step_every_s
                self.step += 1
                for w in self.workers:
                    self.files[w, "events.jsonl"] += (json.dumps(self.step_event(w)) + "\n").encode()
                self.grown.update(self.workers)
            owed += self.lines_per_s * (now - last)
            last = now
            for _ in range(int(owed)):
                w = self.lines_written % len(self.workers)
                self.files[w, "output.log"] += (
                    f"step={self.step} loss=0.0213 reward_mean=0.41 dt=3.21s "
                    f"rollout_generate=2.10s line {self.lines_written}\n").encode()
                if self.lines_written % TIMED_EVERY == 0:
                    self.written_at[self.lines_written] = now
                self.grown.add(w)
                self.lines_written += 1
            owed -= int(owed)
            self.cpu_s += time.thread_time() - cpu
            await asyncio.sleep(0.02)

    def step_event(self, w: int) -> dict:
        return {"t": time.time(), "kind": "step", "process": w, "step": self.step,
                "time/train/step_s": 3.2 + 0.01 * w, "time/train/step_avg_last10_s": 3.2 + 0.01 * w,
                "time/train/rollout_generate_s": 2.1 + 0.01 * w, "time/train/update_s": 1.0,
                "throughput/train/valid_tokens_per_s": 5000.0 + self.step,
                "train-reward/total/mean": min(1.0, 0.05 * self.step)}

    async def follow(self, command: str, w: int, on_line, **_options: object):
        stream = self.watch.workers[w]
        self.followers[w] = (on_line, {"events.jsonl": stream.events_cursor.offset,
                                       "output.log": stream.log.offset})
        self.grown.add(w)
        try:
            await asyncio.Event().wait()  # until the watch stops following (cancelled)
        finally:
            del self.followers[w]

    async def pump(self) -> None:
        """Every `poll_s / PHASES`, the records of one group of workers (those whose files grew); every
        second, each worker's heartbeat (`P`, as a follower's)."""
        from tpu_console.fleet.results import WorkerLine

        next_probe, phase = [0.0] * PHASES, 0
        while True:
            await asyncio.sleep((self.watch.poll_s if self.watch else 0.05) / PHASES)
            phase = (phase + 1) % PHASES
            cpu = time.thread_time()
            probe = time.monotonic() >= next_probe[phase]
            if probe:
                next_probe[phase] = time.monotonic() + 1.0
            turn = [w for w in self.followers if w % PHASES == phase]
            workers = turn if probe else [w for w in turn if w in self.grown]
            self.grown.difference_update(workers)
            records = []
            for w in workers:
                on_line, offsets = self.followers[w]
                for name in offsets:
                    if (record := self.chunk(w, name, offsets, self.watch.max_bytes)) is not None:
                        records.append((on_line, w, record))
                if probe:
                    sizes = f"log={self.size(w, 'output.log')} events={self.size(w, 'events.jsonl')}"
                    records.append((on_line, w, f"P pid=4242 alive=1 exit= exit_t= {sizes}"))
            self.cpu_s += time.thread_time() - cpu
            for on_line, w, record in records:  # the watch's work from here: not the pod's
                if record.startswith("C output.log"):
                    cpu, arrived = time.thread_time(), time.monotonic()
                    for number in self.line_numbers(record):
                        if number % TIMED_EVERY == 0:
                            self.arrived_at[number] = arrived
                    self.cpu_s += time.thread_time() - cpu  # the benchmark's timing, not the console's
                on_line(WorkerLine(w, "stdout", record))

    @staticmethod
    def line_numbers(record: str) -> list[int]:
        data = base64.b64decode(record.rsplit(" ", 1)[1])
        return [int(line.rsplit(b" ", 1)[1]) for line in data.splitlines()]

    def size(self, w: int, name: str) -> int:
        return self.dropped[w, name] + len(self.files[w, name])

    def chunk(self, w: int, name: str, offsets: dict[str, int], max_bytes: int) -> str | None:
        """The follower's `C` record of the bytes from offsets[name] on (and the offset moved past them)."""
        data, dropped, offset = self.files[w, name], self.dropped[w, name], offsets[name]
        if offset > dropped:  # read past these: never asked for again
            del data[: offset - dropped]
            self.dropped[w, name] = dropped = offset
        piece = bytes(data[offset - dropped : offset - dropped + max_bytes])
        if not piece:
            return None
        offsets[name] = offset + len(piece)
        if offsets[name] < self.size(w, name):
            self.grown.add(w)  # more than one chunk's worth: the rest next time
        return (f"C {name} {offset} {offset + len(piece)} {dropped + len(data)} "
                f"{base64.b64encode(piece).decode()}")

    async def close(self) -> None:
        pass


PHASES = 8  # the pump's groups of workers, whose polls take turns over the interval
TIMED_EVERY = 10  # every 10th line's latency is timed (a multiple of 10: its number ends in 0)
SETTLE_S = 2.0  # lines that arrive this soon after the watch starts are its first ones, held to interleave


def _p(values: list[float], q: float) -> float | None:
    values = sorted(values)
    return values[int(q * (len(values) - 1))] if values else None


def run_child(workers: int, lines_per_s: int, stats_path: str) -> None:
    sys.path.insert(0, str(ROOT))
    import contextlib

    from tpu_console.history.store import RunRecord
    from tpu_console.observe.watch import RunWatch
    from tpu_console.secrets import SecretMasker
    from tpu_console.tui import app as app_module
    from tpu_console.tui.app import TpuConsoleApp
    from tpu_console.tui.messages import RunLogLines
    from tpu_console.tui.run_feed import RunFeed
    from tpu_console.tui.screens.run_screen import RunScreen
    from tpu_console.tui.widgets.log_pane import LogPane

    run_id = "20250314-120000-bench"
    record = RunRecord(run_id, "bench-pod", "local", f"local-{workers}x1", list(range(workers)), "c.yaml",
                       "d", [], "python", datetime.now(UTC))
    pod = SyntheticPod(run_id, workers, lines_per_s, step_every_s=2.0 if lines_per_s else None)
    delivered: list[tuple[float, float]] = []  # (the pod's share, the console's) of every 10th line
    add_lines = LogPane.add_lines

    def timed_add_lines(self, lines) -> None:
        add_lines(self, lines)
        cpu, now = time.thread_time(), time.monotonic()
        for _, text in lines:
            if not text.endswith("0"):  # its number is no multiple of TIMED_EVERY (10): not timed
                continue
            number = int(text.rsplit(" ", 1)[1])
            arrived = pod.arrived_at.pop(number, None)
            written = pod.written_at.pop(number, None)
            if arrived is not None and written is not None and arrived - pod.started >= SETTLE_S:
                delivered.append((arrived - written, now - arrived))
        pod.cpu_s += time.thread_time() - cpu  # the benchmark's timing, not the console's

    LogPane.add_lines = timed_add_lines
    cpu_at_start = [0.0]

    @contextlib.asynccontextmanager
    async def open_watch(first_log_lines):
        # As RunWatch.open, over the synthetic pod: masking on, no history store.
        watch = RunWatch(pod, record, masker=SecretMasker(["not-a-real-token-1234", "another-secret-5678"]),
                         first_log_lines=first_log_lines, poll_s=feed.poll_s)
        pod.watch = watch
        cpu_at_start[0] = time.process_time()
        writer = asyncio.create_task(pod.write())
        pump = asyncio.create_task(pod.pump())
        try:
            yield watch
        finally:
            writer.cancel()
            pump.cancel()

    class CountingFeed(RunFeed):
        """RunFeed as the app uses it, counting the lines it hands the screen."""

        lines_shown = 0

        def flush(self, post, force: bool = False) -> None:
            def counted(message) -> None:
                if isinstance(message, RunLogLines):
                    self.lines_shown += len(message.lines)
                post(message)

            super().flush(counted, force=force)

    feed = CountingFeed({}, run_id, first_log_lines=None, open_watch=open_watch)

    class BenchApp(TpuConsoleApp):
        CSS_PATH = str(Path(app_module.__file__).with_name(TpuConsoleApp.CSS_PATH))

        def on_mount(self) -> None:
            self.push_screen(RunScreen({}, run_id, feed=feed))
            # written as it goes: a loaded app may be too slow to quit before it is killed
            self.set_interval(5.0, self.write_stats)

        def on_unmount(self) -> None:
            self.write_stats()

        def write_stats(self) -> None:
            elapsed = time.monotonic() - pod.started
            console = [c for _, c in delivered]
            pod_share = [p for p, _ in delivered]
            Path(stats_path).write_text(json.dumps({
                "lines": feed.lines_shown, "written": pod.lines_written, "seconds": elapsed,
                "cpu_s": time.process_time() - cpu_at_start[0], "pod_cpu_s": pod.cpu_s,
                "timed_lines": len(delivered), "console_p50": _p(console, 0.5),
                "console_p95": _p(console, 0.95), "console_max": _p(console, 1.0),
                "pod_p50": _p(pod_share, 0.5), "pod_p95": _p(pod_share, 0.95)}))

    BenchApp({}, refresh_every=3600).run()


# -- the person side (this process) ----------------------------------------------------------------------


class Terminal:
    """The app in a pseudo-terminal; a thread drains its output so the app never blocks on a write."""

    def __init__(self, args: list[str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(COLUMNS), "LINES": str(ROWS)}
        self.process = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True, close_fds=True)
        os.close(slave)
        self.master = master
        self.output = bytearray()
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self.master], [], [], 0.5)
                if not ready:
                    if self.process.poll() is not None:
                        return
                    continue
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            with self.changed:
                self.output.extend(data)
                self.changed.notify_all()

    def wait_for(self, marker: bytes, start: int, timeout_s: float) -> float | None:
        """perf_counter when `marker` appeared in the output after offset `start`, or None."""
        deadline = time.perf_counter() + timeout_s
        with self.changed:
            while True:
                if self.output.find(marker, start) >= 0:
                    return time.perf_counter()
                left = deadline - time.perf_counter()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def press(self, key: str) -> tuple[float, int]:
        with self.changed:
            start = len(self.output)
        os.write(self.master, key.encode())
        return time.perf_counter(), start

    def close(self) -> None:
        try:
            os.write(self.master, b"q")
            self.process.wait(timeout=30)  # a slow app may take a while to quit (it writes its stats)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        os.close(self.master)


def measure(workers: int, lines_per_s: int, presses: int, warmup_s: float) -> dict:
    with tempfile.TemporaryDirectory() as home:
        stats = Path(home) / "stats.json"
        env_home = {"TPU_CONSOLE_HOME": home}
        os.environ.update(env_home)
        terminal = Terminal([sys.executable, __file__, "--child", "--workers", str(workers),
                             "--lines-per-s", str(lines_per_s), "--stats", str(stats)])
        try:
            if terminal.wait_for(b"log: all workers", 0, timeout_s=60) is None:
                raise SystemExit("error: the app did not show the dashboard within 60 s:\n"
                                 + terminal.output[-2000:].decode(errors="replace"))
            time.sleep(warmup_s)
            latencies, missed = [], 0
            for i in range(presses):
                key = "1" if i % 2 == 0 else "2"
                pressed, start = terminal.press(key)
                shown = terminal.wait_for(f"log: worker {key}".encode(), start, timeout_s=5)
                if shown is None:
                    missed += 1
                else:
                    latencies.append(shown - pressed)
                time.sleep(random.uniform(0.15, 0.3))  # spaced like a person's keys
        finally:
            terminal.close()
        received = json.loads(stats.read_text()) if stats.exists() else {"lines": 0, "seconds": 1}
    seconds = max(received["seconds"], 1e-9)
    app_cpu_s = received.get("cpu_s", 0.0) - received.get("pod_cpu_s", 0.0)
    return {**received, "latencies": latencies, "missed": missed, "lines_per_s": received["lines"] / seconds,
            "cpu_share": app_cpu_s / seconds, "pod_cpu_share": received.get("pod_cpu_s", 0.0) / seconds,
            "cpu_ms_per_10k_lines": 1e7 * app_cpu_s / received["lines"] if received["lines"] else None}


def summary(label: str, result: dict) -> str:
    values = sorted(result["latencies"])
    if not values:
        return f"{label}: no key press was seen on screen ({result['missed']} missed)"
    median = statistics.median(values)
    p95 = values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]
    result["median"], result["p95"] = median, p95
    missed = f", {result['missed']} not seen within 5 s" if result["missed"] else ""
    return (f"{label}: key to frame median {median * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms, "
            f"max {values[-1] * 1000:.1f} ms over {len(values)} presses{missed}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--lines-per-s", type=int, default=10_000, help="log lines per second, all workers")
    parser.add_argument("--presses", type=int, default=60)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of streaming before measuring")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.workers, args.lines_per_s, args.stats)
        return 0

    print(f"run dashboard in a {COLUMNS}x{ROWS} pseudo-terminal, {args.workers} workers, "
          f"{args.presses} presses")
    idle = measure(args.workers, 0, args.presses, args.warmup)
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(summary("(a) idle  ", idle) + f"; the app's own CPU: {idle['cpu_share']:.0%} of a core, the "
          f"synthetic pod's in it {idle['pod_cpu_share']:.0%} (every worker's heartbeat once a second)")
    print(f"load average {os.getloadavg()[0]:.1f}")
    loaded = measure(args.workers, args.lines_per_s, args.presses, args.warmup)
    per_10k = loaded["cpu_ms_per_10k_lines"]
    print(summary("(b) loaded", loaded) + f"; the app took in {loaded['lines_per_s']:,.0f} log lines/s "
          f"(asked for {args.lines_per_s:,}); the app's own CPU: {loaded['cpu_share']:.0%} of a core, the "
          f"synthetic pod's in it {loaded['pod_cpu_share']:.0%} (on a shared machine the share it got, not "
          f"what it would take)" + (f"; {per_10k:,.0f} ms of the app's CPU per 10,000 lines taken in"
                                     if per_10k is not None else ""))
    console_p95 = loaded.get("console_p95")
    if console_p95 is not None:
        print(f"    each line, its arrival -> the log pane (the console's share): p50 "
              f"{loaded['console_p50'] * 1000:.1f} ms, p95 {console_p95 * 1000:.1f} ms, max "
              f"{loaded['console_max'] * 1000:.0f} ms over {loaded['timed_lines']:,} lines (every 10th, from "
              f"{SETTLE_S:g} s after the start); written -> arrival (the pod's: its follower's poll) p50 "
              f"{loaded['pod_p50'] * 1000:.0f} ms, p95 {loaded['pod_p95'] * 1000:.0f} ms")
    print(f"load average {os.getloadavg()[0]:.1f}")
    met = "median" in loaded and loaded["median"] < TARGET_MEDIAN_S and not loaded["missed"]
    console_met = console_p95 is not None and console_p95 < TARGET_CONSOLE_P95_S
    print(f"targets: median under {TARGET_MEDIAN_S * 1000:.0f} ms with the load: "
          f"{'met' if met else 'NOT met'}; "
          f"the console's latency p95 under {TARGET_CONSOLE_P95_S * 1000:.0f} ms: "
          f"{'met' if console_met else 'NOT met'}")
    return 0 if met and console_met else 1


if __name__ == "__main__":
    sys.exit(main())
