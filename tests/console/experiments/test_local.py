"""Experiments on a local pod through the CLI: the FSDP memory bench across workers."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.console.launch.test_local import CONFIG, fake_trainer, run, worker_home
from tests.fixtures_cli import console_home, stand_in_tiny_inputs  # noqa: F401 - fixture
from tpu_console.controller import state as st
from tpu_console.controller.handover import Budgets
from tpu_console.controller.store import open_store
from tpu_console.domain import CreateRequest
from tpu_console.experiments.recovery import launch_with_recovery
from tpu_console.locations import home
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.providers.nodes import create_node
from tpu_console.providers.registry import build_providers, close_providers
from tpu_console.settings import load_settings
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)

pytestmark = pytest.mark.usefixtures("console_home")


@pytest.fixture
def pod2x2(capsys) -> str:
    assert run(capsys, "create", "pod", "--type", "local-2x2")[0] == 0
    stand_in_tiny_inputs(worker_home(w) for w in range(2))
    return "pod"


@pytest.mark.slow
def test_bench_memory_on_every_worker_matches_fsdp(capsys, pod2x2):
    status, out, err = run(
        capsys, "bench-memory", "pod", "--target-bytes-gib", "0.01", "--cols", "512", "--json"
    )
    assert status == 0, err
    cases = {(c["mesh_shape"], c["mode"]): c for c in json.loads(out)["cases"]}
    assert set(cases) == {
        ("auto", "sharded"),
        ("auto", "gather"),
        ("host_local", "sharded"),
        ("host_local", "gather"),
    }
    for (shape, mode), case in cases.items():
        bench = case["bench"]
        fsdp = {"auto": 4, "host_local": 2}[shape]
        assert bench["mesh_axes"]["fsdp"] == fsdp
        want = bench["total_bytes"] // fsdp if mode == "sharded" else bench["total_bytes"]
        assert bench["per_device_array_bytes_max"] == want and case["matches_prediction"] is True
        assert bench["bytes_in_use_max"] is None  # CPU: not reported, never invented


def test_bench_memory_refuses_a_mesh_that_does_not_fit_before_running(capsys, pod2x2):
    status, _, err = run(capsys, "bench-memory", "pod", "--mesh-shape", "3,-1,1")
    assert status == 2 and "mesh_shape: 3,-1,1 cannot fill 4 devices" in err and err.count("\n") == 1
    status, _, err = run(capsys, "bench-memory", "pod", "--mode", "scatter")
    assert status == 2 and "unknown mode 'scatter'" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_finds_the_largest_batch_under_a_simulated_memory_limit(capsys, tmp_path, tiny_model_dir):
    # The trainer's test facility (trainer/fault_injection.py), armed through the job's environment (the
    # env file every trial's job sources): a local batch above 8 fails as an OOM does.
    env_file = tmp_path / "fault.env"
    env_file.write_text("TRAINER_FAULT_MAX_LOCAL_BATCH=8\n")
    assert run(capsys, "create", "one", "--type", "local-1x2")[0] == 0
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    # rollout.n = 4: local batch = 4 x batch_size; the simulated limit lets 8 sequences through, not 12.
    sets = [
        f"model_path={tiny_model_dir}",
        f"data.path={data}",
        "rollout.global_length=64",
        "rollout.max_length_sample=8",
    ]
    argv = ["sweep", "one", "--config", str(CONFIG), "--steps", "1", "--max", "8", "--json",
            "--env-file", str(env_file)]
    for item in sets:
        argv += ["--set", item]
    status, out, err = run(capsys, *argv)
    assert status == 0, err[-3000:]
    result = json.loads(out)
    assert (result["largest_fit"], result["first_oom"]) == (2, 3)
    trials = {t["value"]: t for t in result["trials"]}
    assert trials[4]["outcome"] == "oom" and trials[4]["local_batch"] == 16  # the config's value first
    assert trials[2]["outcome"] == "fits" and trials[3]["outcome"] == "oom"
    assert all(t["peak_gib"] is None for t in trials.values())  # CPU: not reported
    status, listing, _ = run(capsys, "runs", "one", "--json")
    assert {r["run_id"] for r in json.loads(listing)["runs"]} == {t["run_id"] for t in trials.values()}


# A trainer stand-in that checkpoints every step to checkpoint.dir (outside the node) and resumes from it,
# as the real trainer does with orbax; it reports the resume as the real one does (`resumed_step`).
CHECKPOINTING = """\
ck=$(sed -n 's/^  dir: //p' config.yaml); start=0
[ -f "$ck/latest" ] && start=$(cat "$ck/latest")
p=$TRAINER_PROCESS_ID
if [ "$start" -gt 0 ]; then
  echo '{"t": 1, "kind": "warning", "process": '$p', "message": "resumed", "resumed_step": '$start'}' >> events.jsonl
fi
for s in $(seq $((start + 1)) 8); do
  echo '{"t": 1, "kind": "step", "process": '$p', "step": '$s'}' >> events.jsonl
  [ "$p" = 0 ] && echo $s > "$ck/latest.tmp" && mv "$ck/latest.tmp" "$ck/latest"
  sleep 0.3
done
echo '{"t": 2, "kind": "end", "process": '$p', "status": "ok"}' >> events.jsonl
"""  # noqa: E501 - an event line of the fake trainer


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_preempted_spot_run_is_recreated_bootstrapped_synced_and_resumed(tmp_path):
    providers = build_providers(load_settings({}))
    try:
        await create_node(providers, "local", CreateRequest("spot", "local-2x1"))
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        # the inputs the fake trainer never reads, where every worker (the recreated node's too) has them
        stand_in_tiny_inputs([tmp_path])
        sets = [f"checkpoint.dir={ckpt}", "checkpoint.every_steps=1", "steps=8",
                f"model_path={tmp_path / 'tiny-qwen2'}", f"data.path={tmp_path / 'gsm8k-synthetic.jsonl'}"]
        task = asyncio.create_task(
            launch_with_recovery(
                providers,
                "spot",
                str(CONFIG),
                sets,
                python=fake_trainer(tmp_path, CHECKPOINTING),
                watch_every_s=0.3,
                policy=SupervisionPolicy(fail_fast=True),
                budgets=Budgets(max_recoveries=3, confirm_s=0.5),
            )
        )
        for _ in range(300):
            if (ckpt / "latest").exists() and int((ckpt / "latest").read_text()) >= 3:
                break
            await asyncio.sleep(0.05)
        await providers["local"].preempt("spot")
        managed = await asyncio.wait_for(task, timeout=240)
    finally:
        await close_providers(providers)
    assert managed is not None and managed.status == "SUCCEEDED", managed
    (recovery,) = managed.recoveries
    first, second = managed.incarnations
    assert recovery.reason == "preempted" and first.ended == "preempted" and second.ended == "succeeded"
    # resumed from the checkpoint, not from the start; the last step the console saw may lag behind the
    # checkpoint on a busy machine (it polls), so it bounds nothing here
    assert 3 <= recovery.resumed_step <= 8 and recovery.last_step_before is not None
    assert recovery.steps_lost == max(0, recovery.last_step_before - recovery.resumed_step)
    assert recovery.seconds is not None and recovery.seconds > 0
    assert all(v is not None and v >= 0 for v in recovery.parts().values()), recovery.parts()
    saved = st.load(open_store(load_settings({})), managed.id)  # the controller's store: any console reads it
    assert saved.run.status == "SUCCEEDED" and saved.run.recoveries[0].resumed_step == recovery.resumed_step
    # the node the controller made went with the run's success; the run's files are in its archive
    assert not (home() / "local" / "spot").exists()
    archived = home() / "archive" / second.run_id / "worker-0"
    events = [json.loads(line) for line in (archived / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e["kind"] == "step"] == list(range(recovery.resumed_step + 1, 9))
    # the relaunch is supervised as the first launch was asked to be
    assert saved.run.job["policy"]["fail_fast"] is True
    assert (archived / "supervisor.jsonl").read_text().strip()


def test_recover_refuses_checkpoints_a_new_node_cannot_read(capsys, pod2x2):
    status, _, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--recover")
    assert status == 2 and "--recover needs checkpoints" in err
    status, _, err = run(
        capsys,
        "launch",
        "pod",
        "--config",
        str(CONFIG),
        "--recover",
        "--set",
        "checkpoint.dir=ck",
        "--set",
        "checkpoint.every_steps=1",
    )
    assert status == 2 and "use an absolute path outside it" in err


def test_recover_refuses_a_policy_that_deletes_the_node(capsys, pod2x2):
    deleting = (["--on-end", "delete"], ["--max-hang", "30m"], ["--max-cost", "5", "--price-per-hour", "1"])
    for flags in deleting:
        status, _, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--recover", *flags)
        assert status == 2 and "--recover recreates the node" in err, (flags, err)
        assert not (worker_home(0) / "tpu-console" / "runs").exists() or not any(
            (worker_home(0) / "tpu-console" / "runs").iterdir()
        )
