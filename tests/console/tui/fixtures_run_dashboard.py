"""Fixed runs for the run dashboard's Pilot and snapshot tests, and a feed that posts them.

Each run is scripted as a `RunWatch` would report it (log lines scanned for signatures, events, probes
into a `RunMonitor`, the health judged by `runs.health.assess` at chosen moments) and goes through the
real `RunFeed.take`, so what the screen is given is what the feed makes of a watch:

`running_run()`: 4 workers of a v6e-16, workers 0-2 at step 12, worker 2 a straggler (its rollout twice as
slow), worker 3 stalled at step 9 for 95 s, TPU memory with worker 1 near the limit, a W&B URL.
`hung_run()`: worker 1 ran out of HBM and exited 1 at step 3; workers 0, 2, 3 still run (hung).
`failed_run()`: ended, worker 1 exited 1 first out of HBM, the others stopped afterwards (143); CPU devices,
so no memory is reported.
`stopped_run()`: stopped with `x` at step 3 (or `steps`): every worker ended by the stop (143), none failed.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from textual.message import Message

from tests.fixtures_cli import NOW
from tpu_console.history.events import Event, StepMetrics
from tpu_console.history.store import RunRecord
from tpu_console.observe.device_metrics import DeviceMetrics, WorkerDeviceMetrics
from tpu_console.observe.health import Progress, assess
from tpu_console.observe.monitor import RunMonitor
from tpu_console.observe.probe import RunProbe
from tpu_console.observe.signatures import SignatureScanner
from tpu_console.observe.watch import HealthChanged, LogLines, NewEvents, SignatureFound
from tpu_console.tui.messages import RunDevicesRead, RunLogLines
from tpu_console.tui.run_feed import RunFeed
from trainer import telemetry as tm

RUN_ID = "20250314-120000-abcd"
WORKERS = 4
STEPS = 12
GIB = 1 << 30
OOM_LINE = (
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of "
    "memory in memory space hbm. Used 17.44G of 15.48G hbm. Exceeded hbm capacity by 1.96G."
)
WANDB_LINE = "wandb: View run at https://wandb.ai/lab/grpo/runs/k2x9q1"


class FixedFeed:
    """Posts its messages once, then waits like a live feed with nothing new to say. `stop_run` only
    counts its calls."""

    def __init__(
        self, status: list[Message], logs: list[Message] | None = None, devices: list[Message] | None = None
    ) -> None:
        self.status = status
        self.logs = logs or []
        self.devices = devices or []
        self.posted = asyncio.Event()
        self.stops = 0

    async def follow(self, post) -> None:
        for message in [*self.status, *self.logs]:
            post(message)
        self.posted.set()
        await asyncio.Event().wait()

    async def follow_devices(self, post) -> None:
        for message in self.devices:
            post(message)
        await asyncio.Event().wait()

    async def stop_run(self) -> str:
        self.stops += 1
        return f"{RUN_ID}: stopped (4 stopped)"

    async def stacks(self) -> str:
        return "workers 0,2,3: trainer/grpo.py:201 (update); worker 1: did not answer (its job is stopped)"

    async def close(self) -> None:
        pass


def step_metrics(
    worker: int, step: int, *, slow: float = 1.0, memory: bool = True, near_limit: bool = False
) -> StepMetrics:
    return StepMetrics.from_event(step_event(worker, step, slow=slow, memory=memory, near_limit=near_limit))


def step_event(
    worker: int, step: int, *, slow: float = 1.0, memory: bool = True, near_limit: bool = False
) -> Event:
    generate = 2.0 * slow + 0.01 * step
    phases = {
        "rollout_generate": generate,
        "reward": 0.05,
        "advantages": 0.002,
        "shard": 0.03,
        "update": 1.1 + 0.01 * worker,
    }
    step_s = sum(phases.values())
    fields = {tm.phase_key(phase): seconds for phase, seconds in phases.items()}
    fields.update(
        {
            "step": step,
            tm.phase_key("step"): step_s,
            tm.STEP_AVG_LAST10: step_s,
            tm.VALID_TOKENS_PER_S: 5200.0 + 40 * step,
            tm.MEM_IN_USE: (14.6 if near_limit else 9.8 + 0.3 * worker) if memory else None,
            tm.MEM_PEAK: (15.2 if near_limit else 11.4 + 0.3 * worker) if memory else None,
            tm.MEM_LIMIT: 15.75 if memory else None,
            tm.LOSS: 0.02,
            tm.REWARD_MEAN: 0.1 + 0.06 * step,
        }
    )
    return Event("step", 1.0, worker, fields)


class ScriptedRun:
    """A run told as a RunWatch tells it, into a real RunFeed; `messages` is what the feed posted."""

    def __init__(self, node: str, accelerator_type: str) -> None:
        self.record = RunRecord(
            RUN_ID,
            node,
            "gcp",
            accelerator_type,
            list(range(WORKERS)),
            "c.yaml",
            "d",
            [],
            "python",
            datetime(2025, 3, 14, 12, tzinfo=UTC),
        )
        self.monitor = RunMonitor(RUN_ID, self.record.workers)
        self.progress: dict[int, Progress] = {}
        self.scanners = {w: SignatureScanner() for w in self.record.workers}
        self.messages: list[Message] = []
        self.feed = RunFeed({}, RUN_ID, clock=lambda: NOW)
        self.feed.record = self.record

    def probe(self, worker: int, exit_status: int | None = None, exit_time: float | None = None) -> None:
        alive = exit_status is None
        self.monitor.observe(
            worker,
            RunProbe(RUN_ID, pgid=1000 + worker, alive=alive, exit_status=exit_status, exit_time=exit_time),
        )

    def events(self, worker: int, events: list[Event]) -> None:
        self.monitor.workers[worker].events.add(events)
        self.feed.take(NewEvents(worker, events), self.messages.append)

    def log(self, worker: int, lines: list[str]) -> None:
        self.feed.take(LogLines(worker, lines), self.messages.append)
        for line in lines:
            if (finding := self.scanners[worker].scan(line)) is not None:
                self.feed.take(SignatureFound(worker, finding), self.messages.append)

    def judge(self, at_s: float) -> None:
        health = assess(self.monitor, self.progress, at_s)
        self.feed.take(HealthChanged(health), self.messages.append)

    def status(self) -> list[Message]:
        """Everything but the log lines (those go to the logs part of a FixedFeed, all at once)."""
        return [m for m in self.messages if not isinstance(m, RunLogLines)]


def running_run() -> tuple[list[Message], list[Message], list[Message]]:
    run = ScriptedRun("grpo-v6e-16", "v6e-16")
    for worker in range(WORKERS):
        run.probe(worker)
        run.events(worker, [Event("start", 0.0, worker, {})])
    run.log(0, [WANDB_LINE])

    def steps(worker: int, numbers: range) -> None:
        slow = 2.0 if worker == 2 else 1.0
        run.events(worker, [step_event(worker, s, slow=slow, near_limit=worker == 1) for s in numbers])
        last = step_metrics(worker, numbers[-1], slow=slow)
        run.log(
            worker, [f"step={last.step} loss=0.0200 reward_mean={last.reward_mean:.2f} dt={last.step_s:.2f}s"]
        )

    for worker in range(WORKERS):
        steps(worker, range(1, STEPS - 3 + 1 if worker == 3 else STEPS))
    run.judge(1000.0)
    for worker in range(3):  # 95 s later, every worker but 3 has done one more step
        steps(worker, range(STEPS, STEPS + 1))
    run.judge(1095.0)
    logs = [
        RunLogLines(
            [
                (w, f"[w{w}] step={s} loss=0.0200 reward_mean={0.1 + 0.06 * s:.2f}")
                for s in range(1, STEPS + 1)
                for w in range(WORKERS)
            ]
        )
    ]
    return run.status(), logs, [tpu_devices()]


def tpu_devices() -> RunDevicesRead:
    """libtpu's reading of the running run: 4 devices per worker, worker 1's device 2 nearly full."""
    workers = []
    for worker in range(WORKERS):
        devices = [
            DeviceMetrics(
                d,
                int((15.1 if worker == 1 and d == 2 else 10.0 + 0.3 * worker + 0.2 * d) * GIB),
                int(15.75 * GIB),
                80.0 + 2 * d,
            )
            for d in range(4)
        ]
        workers.append(WorkerDeviceMetrics(worker, devices))
    return RunDevicesRead(workers)


def hung_run() -> tuple[list[Message], list[Message], list[Message]]:
    run = ScriptedRun("grpo-v6e-16", "v6e-16")
    for worker in range(WORKERS):
        run.probe(worker)
        run.events(worker, [Event("start", 0.0, worker, {})])
        run.events(worker, [step_event(worker, s) for s in range(1, 4)])
        run.log(worker, ["step=3 loss=0.0100"])
    run.judge(1000.0)
    run.log(1, [OOM_LINE])
    run.events(1, [Event("error", 1010.0, 1, {"message": "RESOURCE_EXHAUSTED: out of memory in hbm"})])
    run.probe(1, exit_status=1, exit_time=1010.0)
    run.judge(1020.0)
    return run.status(), [], []


def failed_run() -> tuple[list[Message], list[Message], list[Message]]:
    run = ScriptedRun("rehearsal", "local-4x2")
    for worker in range(WORKERS):
        run.probe(worker)
        run.events(worker, [Event("start", 0.0, worker, {})])
        run.events(worker, [step_event(worker, s, memory=False) for s in range(1, 4)])
        run.log(worker, ["step=3 loss=0.0100"])
    run.judge(1000.0)
    run.log(1, [OOM_LINE])
    run.probe(1, exit_status=1, exit_time=1010.0)
    for worker in (0, 2, 3):
        run.log(worker, ["Terminated"])
        run.probe(worker, exit_status=143, exit_time=1020.0)
    run.judge(1180.0)
    logs = [
        RunLogLines(
            [(w, f"step={s} loss=0.0100") for s in range(1, 4) for w in range(WORKERS)] + [(1, OOM_LINE)]
        )
    ]
    return (
        run.status(),
        logs,
        [RunDevicesRead([], "the run has ended: libtpu reports only while a job holds the TPU")],
    )


def stopped_run(steps: int = 3) -> tuple[list[Message], list[Message]]:
    run = ScriptedRun("rehearsal", "local-4x2")
    for worker in range(WORKERS):
        run.probe(worker)
        run.events(worker, [Event("start", 0.0, worker, {})])
        run.events(worker, [step_event(worker, s, memory=False) for s in range(1, steps + 1)])
    run.judge(1000.0)
    run.monitor.note_stop(datetime.fromtimestamp(1100.0, UTC))  # `x`, as RunFeed.stop_run notes it
    for worker in range(WORKERS):
        run.events(worker, [Event("error", 1101.0, worker, {"message": "stopped by SIGTERM"})])
        run.log(worker, ["Terminated"])
        run.probe(worker, exit_status=143, exit_time=1101.0)
    run.judge(1180.0)
    lines = [(w, f"step={s} loss=0.0100") for s in range(1, steps + 1) for w in range(WORKERS)]
    return run.status(), [RunLogLines(lines)]
