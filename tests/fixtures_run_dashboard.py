"""Fixed runs for the run dashboard's Pilot and snapshot tests: a feed that posts prepared messages.

`running_run()`: 4 workers at step 12, worker 2 a straggler (its rollout twice as slow), worker 3 stalled,
TPU-like memory with worker 1 near the limit. `failed_run()`: ended, worker 1 exited 1 first with
RESOURCE_EXHAUSTED, the others stopped afterwards; CPU devices, so no memory is reported.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from textual.message import Message

from tests.fixtures_cli import NOW
from tpu_console.runs.events import StepMetrics
from tpu_console.tui.messages import RunLogLines, RunStepsArrived, RunUpdated
from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow

RUN_ID = "20250314-120000-abcd"
WORKERS = 4
STEPS = 12


class FixedFeed:
    """Posts its messages once, then waits like a live feed with nothing new to say."""

    def __init__(self, status: list[Message], logs: list[Message] | None = None) -> None:
        self.status = status
        self.logs = logs or []
        self.posted = asyncio.Event()

    async def follow_status(self, post) -> None:
        for message in self.status:
            post(message)
        self.posted.set()
        await asyncio.Event().wait()

    async def follow_logs(self, post) -> None:
        for message in self.logs:
            post(message)
        await asyncio.Event().wait()


def step_metrics(worker: int, step: int, *, slow: float = 1.0, memory: bool = True,
                 near_limit: bool = False) -> StepMetrics:
    generate = 2.0 * slow + 0.01 * step
    phases = {"rollout_generate": generate, "reward": 0.05, "advantages": 0.002, "shard": 0.03,
              "update": 1.1 + 0.01 * worker}
    step_s = sum(phases.values())
    return StepMetrics(
        step=step,
        step_s=step_s,
        step_avg_last10_s=step_s,
        tokens_per_s=5200.0 + 40 * step,
        mem_in_use_gib=(14.6 if near_limit else 9.8 + 0.3 * worker) if memory else None,
        mem_peak_gib=(15.2 if near_limit else 11.4 + 0.3 * worker) if memory else None,
        mem_limit_gib=15.75 if memory else None,
        loss=0.02,
        reward_mean=0.1 + 0.06 * step,
        phases=phases,
    )


def running_run() -> tuple[list[Message], list[Message]]:
    status: list[Message] = []
    for worker in range(WORKERS):
        last = STEPS - 3 if worker == 3 else STEPS
        status.append(RunStepsArrived(worker, [
            step_metrics(worker, s, slow=2.0 if worker == 2 else 1.0, near_limit=worker == 1)
            for s in range(1, last + 1)
        ]))
    rows = []
    for worker in range(WORKERS):
        last = step_metrics(worker, STEPS, slow=2.0 if worker == 2 else 1.0, near_limit=worker == 1)
        rows.append(WorkerRow(
            worker=worker, state="running", step=STEPS - 3 if worker == 3 else STEPS, step_s=last.step_s,
            last_line=f"step={STEPS} loss=0.0200 reward_mean=0.82 dt={last.step_s:.2f}s",
            stalled_s=95.0 if worker == 3 else None, mem_in_use_gib=last.mem_in_use_gib,
            mem_peak_gib=last.mem_peak_gib, mem_limit_gib=last.mem_limit_gib,
        ))
    status.append(RunUpdated(RunSnapshot(
        run_id=RUN_ID, node="grpo-v6e-16", state="running", workers=tuple(rows), updated_at=NOW,
        wandb_url="https://wandb.ai/lab/grpo/runs/k2x9q1",
    )))
    logs = [RunLogLines([(w, f"[w{w}] step={s} loss=0.0200 reward_mean={0.1 + 0.06 * s:.2f}")
                         for s in range(1, STEPS + 1) for w in range(WORKERS)])]
    return status, logs


def failed_run() -> tuple[list[Message], list[Message]]:
    status: list[Message] = [
        RunStepsArrived(w, [step_metrics(w, s, memory=False) for s in range(1, 4)]) for w in range(WORKERS)
    ]
    rows = tuple(
        WorkerRow(worker=1, state="exited", step=3, step_s=3.2, exit_status=1, failed=True,
                  error="RESOURCE_EXHAUSTED: out of memory in hbm (local batch 16; lower rollout.batch_size)",
                  last_line="jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED")
        if w == 1 else
        WorkerRow(worker=w, state="exited", step=3, step_s=3.2, exit_status=143, failed=True,
                  last_line="Terminated")
        for w in range(WORKERS)
    )
    status.append(RunUpdated(RunSnapshot(
        run_id=RUN_ID, node="rehearsal", state="failed", workers=rows, updated_at=NOW + timedelta(minutes=3),
        failure="worker 1 exited 1: RESOURCE_EXHAUSTED: out of memory in hbm (local batch 16; lower "
                "rollout.batch_size)",
        first_failure=1, ended=True,
    )))
    logs = [RunLogLines([(w, f"step={s} loss=0.0100") for s in range(1, 4) for w in range(WORKERS)]
                        + [(1, "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED")])]
    return status, logs
