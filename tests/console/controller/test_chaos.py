"""The chaos measure's rules on a small scale (benchmarks/chaos.py runs the real trainer): a managed run on
emulated Cloud TPU nodes whose workers are local pods (tests/emulated_pods.py), preempted twice, once while
its zone fills the next queued request only after a wait and once while its zone fails every request (the
create moves on), with two controllers up and the acting one killed mid-recovery: the run reaches its last
step, each preemption loses at most a checkpoint's worth of steps, and at the end no node and no queued
request is left, with never two live at once."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.console.controller.test_invariants import Watch
from tests.console.launch.test_local import CONFIG, fake_trainer
from tests.emulated_pods import EmulatedPods
from tests.fixtures_cli import stand_in_tiny_inputs
from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home  # noqa: F401 - fixtures
from tpu_console.controller import relaunch
from tpu_console.controller import state as st
from tpu_console.controller.handover import Budgets, hand_over
from tpu_console.controller.loop import Controller
from tpu_console.controller.store import FolderStore
from tpu_console.domain import CreateRequest
from tpu_console.launch.job_kinds import validate_config
from tpu_console.launch.start import launch
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.providers.nodes import create_node

Z1, Z2, _ = ZONES
STEPS = 30
# A trainer stand-in that checkpoints every step to checkpoint.dir and resumes from it, reporting the resume
# as the trainer does (`resumed_step`).
TRAINER = """\
ck=$(sed -n 's/^  dir: //p' config.yaml); last=$(sed -n 's/^steps: //p' config.yaml); start=0
[ -f "$ck/latest" ] && start=$(cat "$ck/latest")
if [ "$start" -gt 0 ]; then
  echo '{"t": '$(date +%s)', "kind": "warning", "process": 0, "message": "resumed", "resumed_step": '$start'}' >> events.jsonl
fi
for s in $(seq $((start + 1)) $last); do
  sleep 0.25
  echo '{"t": '$(date +%s)', "kind": "step", "process": 0, "step": '$s'}' >> events.jsonl
  echo $s > "$ck/latest.tmp" && mv "$ck/latest.tmp" "$ck/latest"
done
echo '{"t": '$(date +%s)', "kind": "end", "process": 0, "status": "ok"}' >> events.jsonl
"""  # noqa: E501 - an event line of the fake trainer


def steps_made(provider: EmulatedPods, run_id: str) -> int:
    path = provider.pods.store.worker_dir("spot", 0) / "tpu-console" / "runs" / run_id / "events.jsonl"
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return 0
    return max((json.loads(line)["step"] for line in lines if '"kind": "step"' in line), default=0)


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_a_managed_run_through_preemptions_a_late_request_a_failing_zone_and_a_killed_controller(
        emulator, gcp_home, tmp_path, monkeypatch):
    # the stand-in trainer needs no bootstrap nor sync (test_daemon.py and test_local.py recover with them)
    async def prepared(providers, node, job, project, setup, progress=None, bootstrapped=lambda: None,
                       store=None):
        bootstrapped()

    monkeypatch.setattr(relaunch, "prepare", prepared)
    provider = EmulatedPods(emulator.endpoint, PROJECT, ZONES, gcp_home / "local", poll_interval=0.02)
    providers = {"gcp": provider}
    store = FolderStore(tmp_path / "controller")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    stand_in_tiny_inputs([tmp_path])
    sets = [f"checkpoint.dir={ckpt}", "checkpoint.every_steps=1", f"steps={STEPS}",
            f"model_path={tmp_path / 'tiny-qwen2'}", f"data.path={tmp_path / 'gsm8k-synthetic.jsonl'}"]
    python = fake_trainer(tmp_path, TRAINER)
    controllers: list[Controller] = []
    tasks: list[asyncio.Task] = []

    def start_controller() -> Controller:
        controller = Controller(providers, store, poll_s=0.1, read_timeout_s=5, lease_ttl_s=3.0, sweep_s=2)
        controllers.append(controller)
        tasks.append(asyncio.create_task(controller.serve()))
        return controller

    async def wait_for(predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := predicate():
                return value
            await asyncio.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout} s: {st.load(store, managed.id).run}")

    try:
        await create_node(providers, "gcp", CreateRequest("spot", "local-1x1", zones=(Z1,)))
        watch = Watch(emulator, "spot")
        policy = SupervisionPolicy(fail_fast=True)
        result = await launch(providers, "spot", str(CONFIG), sets, python=python, policy=policy,
                              check_ports=False)
        assert result.ok, result.starts
        job = relaunch.job_of_trainer(validate_config(CONFIG, sets), None, python, policy, check_ports=False)
        # no pod doctor: its JAX check would only add its start here (the loop's use of it: test_invariants)
        managed = hand_over(store, result, job, ZONES, Budgets(max_recoveries=4, confirm_s=0.3, queued=True,
                                                                  doctor=False))
        start_controller(), start_controller()  # two at once: one acts
        lost = []
        for index in range(2):
            run = st.load(store, managed.id).run
            run_id, zone = run.current.run_id, run.current.zone
            await wait_for(lambda r=run_id: steps_made(provider, r) >= 5, 120, f"run {index} makes steps")
            if index == 0:
                emulator.capacity_after(zone, 2.0)  # the next request is filled late
            else:
                emulator.fail_queued(zone, "There is no more capacity in the zone.")  # the create moves on
            emulator.preempt(zone, "spot")
            await provider.pods.preempt("spot")
            made = steps_made(provider, run_id)  # once its jobs are dead: the last step it made
            if index == 1:  # the acting controller killed mid-recovery (its lease not given back)
                await wait_for(lambda: (st.load(store, managed.id).run.intent or {}).get("action") in (
                    "create", "prepare"), 60, "the recovery under way")
                acting = next(c for c in controllers if c.lease.held)
                acting.lease.release = lambda: None
                tasks[controllers.index(acting)].cancel()
                start_controller()
            recovered = await wait_for(
                lambda n=index + 1: next((r for r in st.load(store, managed.id).run.recoveries
                                          if r.n == n and r.first_step_at is not None), None),
                180, f"recovery {index + 1}")
            lost.append(made - recovered.resumed_step)
            emulator._capacity_after.pop(zone, None)
            emulator._queued_failures.pop(zone, None)
        done = await wait_for(lambda: (r := st.load(store, managed.id).run).state.terminal and not r.intent
                              and r, 120, "the run ends and is swept")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await provider.close()
    most = watch.stop()
    assert done.status == "SUCCEEDED" and done.current.last_step == STEPS, done
    assert [r.zone for r in done.recoveries] == [Z1, Z2]  # the second moved on from the failing zone
    assert done.recoveries[0].parts()["create"] >= 2.0  # the late-filled request was waited for
    assert all(0 <= n <= 1 for n in lost), lost  # a checkpoint every step
    assert most <= 1, "two live nodes or queued requests of the run at once"
    with emulator._lock:
        assert not [n for n in emulator._nodes.values() if n.node_id == "spot"] and not emulator._queued
    assert not (gcp_home / "local" / "spot").exists()
    assert sum(1 for c in controllers if c.actions) <= 2  # the first acting one, then the one after the kill
