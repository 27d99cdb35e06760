"""GRPO through jax.distributed: 4 processes x 4 CPU devices, both mesh kinds and the rollout layouts,
every process's events checked; the wrong-process-count guard; checkpoint resume."""

from __future__ import annotations

import signal
import time

import pytest

from tests.trainer.launch import launch, read_events, spawn, tiny_config, wait_all
from trainer import telemetry as tm

STEP_KEYS = [tm.phase_key(p) for p in tm.PHASES] + [
    tm.STEP, tm.STEP_AVG_LAST10, tm.VALID_TOKENS_PER_S, tm.MEM_IN_USE, tm.MEM_PEAK, tm.MEM_LIMIT,
    tm.REWARD_MEAN, tm.REWARD_STD, tm.reward_fn_key("correct"), tm.reward_fn_key("format"),
    tm.reward_fn_key("tag_count"), tm.LOSS, tm.ENTROPY, tm.KL, tm.CLIP_FRACTION, tm.COMPLETION_LEN_MEAN,
    tm.COMPLETION_LEN_MAX, tm.COMPILE_COUNT]


def check_run(results, *, steps: int, mesh_axes: dict, spans_hosts: bool) -> None:
    digests, rewards = set(), set()
    for i, r in enumerate(results):
        assert r.returncode == 0, f"process {i} failed:\n{r.output[-3000:]}"
        kinds = [e["kind"] for e in r.events]
        assert kinds[0] == "start" and kinds[-1] == "end", kinds
        assert all(e["process"] == i for e in r.events)
        start = r.events[0]
        assert (
            start["process_count"] == 4 and start["device_count"] == 16 and start["local_device_count"] == 4
        )
        assert start["mesh_axes"] == mesh_axes and start["fsdp_spans_hosts"] is spans_hosts
        assert start["local_batch"] == 4 and start["global_batch"] == 16
        digests.add(start["config_digest"])
        step_events = [e for e in r.events if e["kind"] == "step"]
        assert [e["step"] for e in step_events] == list(range(1, steps + 1))
        for e in step_events:
            missing = [k for k in STEP_KEYS if k not in e]
            assert not missing, missing
            assert e[tm.MEM_LIMIT] is None  # CPU reports no device memory: null, not a made-up number
            assert e[tm.MEM_IN_USE_PER_DEVICE] == [None] * 4
            assert e[tm.phase_key("step")] >= e[tm.phase_key("rollout_generate")] > 0
            assert 0 < e[tm.COMPLETION_LEN_MEAN] <= 8 and e[tm.VALID_TOKENS_PER_S] > 0
            rewards.add((e["step"], e[tm.REWARD_MEAN]))
        # the compiled programs are reused: no new compilation after the first step
        assert step_events[-1][tm.COMPILE_COUNT] == step_events[0][tm.COMPILE_COUNT]
        assert "step=2 loss=" in r.output and " dt=" in r.output and "rollout_generate=" in r.output
    assert len(digests) == 1
    assert len(rewards) == steps  # reward stats are global: every process reports the same numbers


@pytest.mark.slow
def test_four_processes_auto_mesh(tmp_path, tiny_model_dir):
    # With the KL term, so the reference log-prob pass runs across processes too.
    config = tiny_config(tmp_path, tiny_model_dir, mesh_shape="auto", **{"train.beta": 0.04})
    results = launch(tmp_path, config, processes=4, devices=4)
    check_run(results, steps=2, mesh_axes={"dp": 1, "fsdp": 16, "tp": 1}, spans_hosts=True)
    assert "fsdp axis (16 devices) spans 4 hosts" in results[0].output


@pytest.mark.slow
def test_four_processes_head_groups_with_a_copy_on_every_two_hosts(tmp_path, tiny_model_dir):
    # head_groups with two copies of the weights (rollout.weight_copies): each copy's shard_maps run on the
    # 8 devices of two processes, and its collectives never leave them.
    config = tiny_config(tmp_path, tiny_model_dir, mesh_shape="auto",
                         **{"rollout.weight_layout": "head_groups", "rollout.weight_copies": 2})
    results = launch(tmp_path, config, processes=4, devices=4)
    check_run(results, steps=2, mesh_axes={"dp": 1, "fsdp": 16, "tp": 1}, spans_hosts=True)
    layout = results[0].events[0]["rollout_layout"]
    assert (layout["weight_layout"], layout["copies"]) == ("head_groups", 2)
    assert layout["why"] == "configured; 2 copies of the weights, 8 chips each"


@pytest.mark.slow
def test_four_processes_host_local_mesh(tmp_path, tiny_model_dir):
    config = tiny_config(
        tmp_path,
        tiny_model_dir,
        mesh_shape="host_local",
        **{"train.micro_batch_size_per_device": 1},
    )
    results = launch(tmp_path, config, processes=4, devices=4)
    check_run(results, steps=2, mesh_axes={"dp": 4, "fsdp": 4, "tp": 1}, spans_hosts=False)


def test_wrong_process_count_fails_at_once(tmp_path, tiny_model_dir):
    config = tiny_config(tmp_path, tiny_model_dir)
    [result] = launch(
        tmp_path,
        config,
        processes=1,
        devices=4,
        distributed=False,
        timeout=60,
        extra_env={"TRAINER_REQUIRE_PROCESS_COUNT": "4"},
    )
    message = (
        "Expected 4 JAX processes but jax.process_count()==1: only some workers were launched; "
        "launch on all workers (--worker all)"
    )
    assert result.returncode != 0
    assert message in result.output
    assert [e["kind"] for e in result.events] == ["error"]
    assert result.events[0]["message"] == message and result.events[0]["type"] == "LaunchError"


def test_checkpoint_resume_and_eval(tmp_path, tiny_model_dir):
    ckpt = tmp_path / "ckpt"
    # The two runs compile the same programs: the second reads them from a JAX compilation cache the first
    # writes (this test counts no compilations), instead of compiling them again.
    jax_cache = {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }
    # The first run also evaluates at its last step: 3 samples padded to the 2 local devices.
    config = tiny_config(
        tmp_path,
        tiny_model_dir,
        steps=1,
        eval_every_steps=1,
        eval_samples=3,
        **{"checkpoint.dir": str(ckpt), "checkpoint.every_steps": 1},
    )
    [first] = launch(
        tmp_path, config, processes=1, devices=2, distributed=False, tag="first", extra_env=jax_cache
    )
    assert first.returncode == 0, first.output[-3000:]
    # The layout `auto` chose, recorded before the weights load (CPU: fsdp) and printed once.
    assert first.events[0]["rollout_layout"] == {"weight_layout": "fsdp", "configured": "auto",
                                                 "why": "auto: not on TPU", "copies": 1}
    assert "info: rollout layout fsdp (auto: not on TPU)" in first.output
    [evaluation] = [e for e in first.events if e["kind"] == "eval"]
    assert evaluation["step"] == 1 and evaluation["eval/samples"] == 3
    assert 0.0 <= evaluation["eval/accuracy"] <= 1.0 and "eval step=1 accuracy=" in first.output
    assert [p.name for p in ckpt.iterdir() if p.name.isdigit()] == ["1"]
    config = tiny_config(
        tmp_path, tiny_model_dir, steps=2, **{"checkpoint.dir": str(ckpt), "checkpoint.every_steps": 1}
    )
    [second] = launch(
        tmp_path, config, processes=1, devices=2, distributed=False, tag="second", extra_env=jax_cache
    )
    assert second.returncode == 0, second.output[-3000:]
    assert "resumed from checkpoint step 1" in second.output
    assert [e["step"] for e in second.events if e["kind"] == "step"] == [2]
    assert second.events[-1]["kind"] == "end" and second.events[-1]["first_step"] == 2
    assert sorted(p.name for p in ckpt.iterdir() if p.name.isdigit()) == ["1", "2"]


def test_sigterm_writes_an_error_event_and_exits_143(tmp_path, tiny_model_dir):
    # Two processes through jax.distributed: its preemption notifier must not swallow the stop signal.
    config = tiny_config(tmp_path, tiny_model_dir, steps=50)
    procs = spawn(tmp_path, config, processes=2, devices=1, distributed=True)
    deadline = time.monotonic() + 90
    while (
        not all(read_events(p.run_dir) for p in procs)
        and time.monotonic() < deadline
        and all(p.proc.poll() is None for p in procs)
    ):
        time.sleep(0.2)
    assert all(read_events(p.run_dir)[0]["kind"] == "start" for p in procs)
    for p in procs:
        p.proc.send_signal(signal.SIGTERM)
    for result in wait_all(procs, timeout=60):
        assert result.returncode == 128 + signal.SIGTERM, result.output[-2000:]
        assert result.events[-1]["kind"] == "error" and result.events[-1]["type"] == "Terminated"
        assert result.events[-1]["message"] == "stopped by SIGTERM"


def test_mesh_that_does_not_fit_the_devices_is_a_config_error(tmp_path, tiny_model_dir):
    config = tiny_config(tmp_path, tiny_model_dir, mesh_shape="3,-1,1")
    [result] = launch(tmp_path, config, processes=1, devices=4, distributed=False, timeout=60)
    assert result.returncode == 2
    assert "error: invalid config for this pod: mesh_shape: 3,-1,1 cannot fill 4 devices" in result.output
    assert [e["kind"] for e in result.events] == ["error"] and result.events[0]["type"] == "ConfigError"
