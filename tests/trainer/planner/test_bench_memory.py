"""The FSDP memory bench: per-device bytes of a sharded vs gathered buffer on a 4x4 local pod (4 processes x
4 CPU devices through jax.distributed), and byte counts above 2^31 gathered across processes exactly."""

from __future__ import annotations

import numpy as np
import pytest

from tests.trainer.launch import read_events, spawn, wait_all
from trainer.planner.bench_memory import buffer_shape, join_u64, split_u64


def test_hi_lo_words_carry_values_beyond_int32_exactly():
    values = [0, 1, 2**31 - 1, 2**31, 5 * 2**31 + 7, 6_012_954_214, 2**63 + 12345]
    pairs = split_u64(values)
    assert pairs.dtype == np.int32 and pairs.shape == (len(values), 2)
    assert join_u64(pairs).tolist() == values


def test_allgather_u64_in_one_process_is_exact():
    from trainer.planner.bench_memory import allgather_u64

    gathered = allgather_u64([5 * 2**31 + 7, 3])
    assert gathered.shape == (1, 2) and gathered.tolist() == [[5 * 2**31 + 7, 3]]


def test_buffer_rows_divide_over_fsdp():
    rows, cols = buffer_shape(10 * 2**20, 1024, 16)
    assert rows % 16 == 0 and abs(rows * cols * 2 - 10 * 2**20) < 16 * cols * 2


@pytest.mark.slow
@pytest.mark.parametrize(("mesh_shape", "fsdp"), [("auto", 16), ("host_local", 4)])
def test_sharded_is_total_over_fsdp_and_gathered_is_total_on_a_4x4_pod(tmp_path, mesh_shape, fsdp):
    for mode in ("sharded", "gather"):
        spawned = spawn(
            tmp_path,
            tmp_path / "unused.yaml",
            processes=4,
            devices=4,
            tag=f"{mesh_shape}-{mode}",
            trainer_args=[
                "bench-memory",
                "--mesh-shape",
                mesh_shape,
                "--mode",
                mode,
                "--target-bytes-gib",
                "0.01",
                "--cols",
                "512",
            ],
        )
        results = wait_all(spawned, timeout=180)
        for process, result in enumerate(results):
            assert result.returncode == 0, result.output[-2000:]
            (bench,) = [e for e in read_events(spawned[process].run_dir) if e["kind"] == "bench"]
            assert bench["process"] == process and bench["mesh_axes"]["fsdp"] == fsdp
            total = bench["total_bytes"]
            want = total // fsdp if mode == "sharded" else total
            assert bench["per_device_array_bytes_local_max"] == bench["per_device_array_bytes_max"] == want
            assert bench["bytes_in_use_max"] is None  # CPU reports no device memory: null, never invented
