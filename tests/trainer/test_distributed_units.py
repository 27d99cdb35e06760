"""Pure pieces of the multi-host start: mesh shapes, the TRAINER_* environment, the process-count guard,
host<->global batch rows, and the telemetry writer and step line."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

from trainer import telemetry as tm
from trainer.distributed import LaunchError, read_launch_env, require_process_count
from trainer.mesh import (
    MeshError,
    batch_sharding,
    fsdp_spans_hosts,
    global_from_local_rows,
    local_rows,
    make_mesh,
    reshard,
    resolve_mesh_shape,
    train_sharding,
)


@pytest.mark.parametrize("shape, devices, processes, expected", [
    ("auto", 16, 4, (1, 16, 1)),
    ("auto", 8, 1, (1, 8, 1)),
    ("host_local", 16, 4, (4, 4, 1)),
    ("host_local", 8, 2, (2, 4, 1)),
    ("1,-1,1", 16, 4, (1, 16, 1)),
    ("2,-1,2", 16, 4, (2, 4, 2)),
    ("-1,4,1", 16, 4, (4, 4, 1)),
    ("2,4,2", 16, 4, (2, 4, 2)),
])
def test_mesh_shapes(shape, devices, processes, expected):
    assert resolve_mesh_shape(shape, devices, processes) == expected


@pytest.mark.parametrize("shape, devices, words", [
    ("3,-1,1", 16, "cannot fill 16 devices"),
    ("2,2,2", 16, "uses 8 devices but there are 16"),
    ("1,-1,-1", 16, "at most one -1"),
])
def test_mesh_shapes_that_do_not_fit(shape, devices, words):
    with pytest.raises(MeshError, match=words):
        resolve_mesh_shape(shape, devices, 4)


def test_mesh_on_local_devices_and_row_round_trip():
    mesh = make_mesh("auto")
    n = jax.device_count()
    assert dict(mesh.shape) == {"dp": 1, "fsdp": n, "tp": 1} and not fsdp_spans_hosts(mesh)
    rows = np.arange(n * 3 * 2).reshape(n * 3, 2)
    for sharding in (batch_sharding(mesh), train_sharding(mesh)):
        array = global_from_local_rows(rows, mesh, sharding)
        assert array.sharding == sharding
        np.testing.assert_array_equal(local_rows(array, mesh), rows)
    np.testing.assert_array_equal(np.asarray(reshard(array, batch_sharding(mesh))), rows)


def test_launch_env_parsing():
    env = read_launch_env({"TRAINER_COORDINATOR_ADDRESS": "10.0.0.2:1234", "TRAINER_NUM_PROCESSES": "4",
                           "TRAINER_PROCESS_ID": "3", "TRAINER_REQUIRE_PROCESS_COUNT": "4"})
    assert env.explicit and env.num_processes == 4 and env.process_id == 3 and env.require_process_count == 4
    assert env.init_timeout_s == 300
    plain = read_launch_env({})
    assert not plain.explicit and plain.require_process_count is None
    with pytest.raises(LaunchError, match="TRAINER_NUM_PROCESSES or TRAINER_PROCESS_ID is not"):
        read_launch_env({"TRAINER_COORDINATOR_ADDRESS": "h:1"})
    with pytest.raises(LaunchError, match="outside 0..3"):
        read_launch_env({"TRAINER_COORDINATOR_ADDRESS": "h:1", "TRAINER_NUM_PROCESSES": "4",
                         "TRAINER_PROCESS_ID": "4"})
    with pytest.raises(LaunchError, match="TRAINER_REQUIRE_PROCESS_COUNT='four' is not an integer"):
        read_launch_env({"TRAINER_REQUIRE_PROCESS_COUNT": "four"})


def test_process_count_guard():
    require_process_count(None, 1)
    require_process_count(4, 4)
    with pytest.raises(LaunchError) as info:
        require_process_count(4, 1)
    assert str(info.value) == ("Expected 4 JAX processes but jax.process_count()==1: only some workers were "
                               "launched; launch on all workers (--worker all)")
    with pytest.raises(LaunchError, match="more processes joined"):
        require_process_count(2, 4)


def test_event_log_writes_flat_json_lines_with_nulls(tmp_path):
    log = tm.EventLog(tmp_path / "run", process=3)
    log.emit(tm.KIND_STEP, **{tm.STEP: 1, tm.LOSS: np.float32(0.5), tm.MEM_LIMIT: None, "nan": math.nan,
                             "axes": {"dp": 1}})
    with pytest.raises(ValueError):
        log.emit("progress")
    [line] = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    event = json.loads(line)
    assert event["kind"] == "step" and event["process"] == 3 and event["t"] > 1.6e9
    assert event[tm.LOSS] == 0.5 and event[tm.MEM_LIMIT] is None and event["nan"] is None
    assert event["axes"] == {"dp": 1}


def test_human_step_line_and_cpu_memory_is_null():
    metrics = {tm.STEP: 7, tm.LOSS: 0.0123, tm.ENTROPY: 1.5, tm.KL: 0.0, tm.REWARD_MEAN: 0.25,
               tm.VALID_TOKENS_PER_S: 2293.0, **{tm.phase_key(p): 0.5 for p in tm.PHASES}}
    metrics[tm.phase_key("step")] = 12.345
    line = tm.human_step_line(metrics)
    assert line.startswith("step=7 loss=0.0123 entropy=1.5 kl=0 reward_mean=0.25 dt=12.35s ")
    assert "rollout_generate=0.50s reward=0.50s advantages=0.50s shard=0.50s update=0.50s" in line
    memory = tm.device_memory()
    if jax.default_backend() == "cpu":
        assert memory[tm.MEM_IN_USE] is None and memory[tm.MEM_PEAK] is None and memory[tm.MEM_LIMIT] is None
        assert memory[tm.MEM_IN_USE_PER_DEVICE] == [None] * jax.local_device_count()

    class FakeDevice:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats

    gib = 1 << 30
    memory = tm.device_memory([FakeDevice({"bytes_in_use": 2 * gib, "peak_bytes_in_use": 3 * gib,
                                           "bytes_limit": 16 * gib}),
                               FakeDevice({"bytes_in_use": 5 * gib, "peak_bytes_in_use": 6 * gib,
                                           "bytes_limit": 16 * gib})])
    assert (memory[tm.MEM_IN_USE], memory[tm.MEM_PEAK], memory[tm.MEM_LIMIT]) == (5.0, 6.0, 16.0)
    assert memory[tm.MEM_PEAK_PER_DEVICE] == [3.0, 6.0]
    timer = tm.PhaseTimer()
    assert [timer.record_step(s) for s in (1.0, 3.0)] == [1.0, 2.0]


def test_wandb_offline_from_process_0_only_and_disabled_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    tm.WandbSink("disabled", None, None, {}, 0, tmp_path / "disabled").log({tm.LOSS: 1.0}, step=1)
    tm.WandbSink("offline", "p", "n", {}, 1, tmp_path / "worker1").log({tm.LOSS: 1.0}, step=1)
    assert not (tmp_path / "disabled").exists() and not (tmp_path / "worker1").exists()
    sink = tm.WandbSink("offline", "tpu-console-test", "unit", {"steps": 1}, 0, tmp_path / "worker0")
    sink.log({tm.LOSS: 0.5, tm.MEM_LIMIT: None, tm.MEM_IN_USE_PER_DEVICE: [None]}, step=1)
    sink.finish()
    # wandb writes the log asynchronously
    [run] = list((tmp_path / "worker0" / "wandb").glob("offline-run-*"))
    assert list(run.glob("*.wandb"))
