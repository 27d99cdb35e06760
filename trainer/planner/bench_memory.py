"""`python -m trainer bench-memory`: what FSDP sharding saves, measured on the devices.

One weight-sized bf16 buffer is laid out over the mesh in one of two ways:
- `sharded`: rows split over the `fsdp` axis (replicated over `dp`), as the trainer keeps its parameters;
- `gather`: the same buffer replicated on every device, which is what an all-gather over `fsdp` produces.
Each device then holds about `total / fsdp` (sharded) or `total` (gather) bytes. The bench reports the
array bytes each local device holds and `memory_stats()` in-use/peak (null on CPU), the max over this
process and over all processes, as a `bench` event in events.jsonl and a line on stdout.

Byte counts above 2^31 do not survive `process_allgather` as int64 on TPU (it materialises int32), so they
travel as hi/lo 32-bit words and are put back together on the host (`allgather_u64`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from trainer.distributed import initialize_or_explain, read_launch_env, require_process_count
from trainer.telemetry import GIB, KIND_BENCH, EventLog

MODES = ("sharded", "gather")


def split_u64(values: Sequence[int]) -> np.ndarray:
    """Unsigned 64-bit values as int32 (hi, lo) pairs, each word's bits kept (lo may read negative)."""
    words = np.asarray(values, dtype=np.uint64)
    hi = (words >> np.uint64(32)).astype(np.uint32).view(np.int32)
    lo = (words & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
    return np.stack([hi, lo], axis=-1)


def join_u64(pairs: np.ndarray) -> np.ndarray:
    pairs = np.asarray(pairs, dtype=np.int32)
    hi = pairs[..., 0].view(np.uint32).astype(np.uint64)
    lo = pairs[..., 1].view(np.uint32).astype(np.uint64)
    return (hi << np.uint64(32)) | lo


def allgather_u64(values: Sequence[int]) -> np.ndarray:
    """`values` of every process, as a [process, len(values)] uint64 array, exact beyond 2^31."""
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(split_u64(values))
    return join_u64(np.asarray(gathered).reshape(-1, len(values), 2))


def buffer_shape(target_bytes: int, cols: int, row_multiple: int) -> tuple[int, int]:
    """A bf16 [rows, cols] buffer of about `target_bytes`, rows a multiple of the fsdp size."""
    rows = max(1, target_bytes // (2 * cols))
    rows = max(row_multiple, rows - rows % row_multiple)
    return rows, cols


def run(mesh_shape: str, mode: str, target_bytes_gib: float, cols: int, events: EventLog) -> dict:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from trainer.mesh import axis_sizes, make_mesh
    from trainer.telemetry import device_memory

    mesh = make_mesh(mesh_shape)  # MeshError (a ValueError) names mesh_shape and the fix
    sizes = axis_sizes(mesh)
    rows, cols = buffer_shape(int(target_bytes_gib * GIB), cols, sizes["fsdp"])
    sharded = NamedSharding(mesh, PartitionSpec("fsdp", None))
    weights = jax.jit(lambda: jnp.ones((rows, cols), jnp.bfloat16), out_shardings=sharded)()
    if mode == "gather":  # the all-gather over fsdp: every device ends up with the whole buffer
        weights = jax.jit(lambda w: w, out_shardings=NamedSharding(mesh, PartitionSpec()))(weights)
    weights.block_until_ready()

    per_device = {d: 0 for d in jax.local_devices()}
    for shard in weights.addressable_shards:
        per_device[shard.device] += shard.data.nbytes
    memory = device_memory()
    local = [max(per_device.values()), _bytes(memory["memory/train/bytes_in_use_max_gib"]),
             _bytes(memory["memory/train/peak_bytes_in_use_max_gib"])]
    everywhere = allgather_u64([v if v is not None else 0 for v in local]).max(axis=0)
    total = rows * cols * 2
    fields = {
        "mode": mode, "mesh_shape": mesh_shape, "mesh_axes": sizes, "total_bytes": int(total),
        "per_device_array_bytes_local_max": int(local[0]),
        "per_device_array_bytes_max": int(everywhere[0]),
        "bytes_in_use_local_max": local[1], "peak_bytes_in_use_local_max": local[2],
        # Over all processes; null where the platform reports no device memory (CPU), never invented.
        "bytes_in_use_max": int(everywhere[1]) if local[1] is not None else None,
        "peak_bytes_in_use_max": int(everywhere[2]) if local[2] is not None else None,
        "expected_per_device_bytes": int(total // sizes["fsdp"] if mode == "sharded" else total),
    }
    events.emit(KIND_BENCH, **fields)
    print(f"bench-memory mode={mode} mesh={mesh_shape} dp={sizes['dp']} fsdp={sizes['fsdp']} "
          f"total={total / GIB:.3f}GiB per_device_array={fields['per_device_array_bytes_max'] / GIB:.3f}GiB "
          f"in_use={_gib(fields['bytes_in_use_max'])} peak={_gib(fields['peak_bytes_in_use_max'])}",
          flush=True)
    return fields


def _bytes(gib: float | None) -> int | None:
    return None if gib is None else round(gib * GIB)


def _gib(value: int | None) -> str:
    return "null" if value is None else f"{value / GIB:.3f}GiB"


def main(argv: Sequence[str], events: EventLog | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer bench-memory",
                                     description="Per-device bytes of an FSDP-sharded vs all-gathered "
                                                 "buffer.")
    parser.add_argument("--mesh-shape", default="auto", help="auto, host_local or dp,fsdp,tp")
    parser.add_argument("--mode", choices=MODES, default="sharded")
    parser.add_argument("--target-bytes-gib", type=float, default=5.6,
                        help="buffer size (default 5.6: Qwen2.5-3B's bf16 weights)")
    parser.add_argument("--cols", type=int, default=4096, help="buffer columns (default 4096)")
    parser.add_argument("--run-dir", default=None, help="folder for events.jsonl")
    args = parser.parse_args(argv)
    if args.target_bytes_gib <= 0 or args.cols <= 0:
        parser.error("--target-bytes-gib and --cols must be positive")
    launch = read_launch_env()
    initialize_or_explain(launch, launch.require_process_count)
    import jax

    require_process_count(launch.require_process_count, jax.process_count())
    events = events or EventLog(args.run_dir, jax.process_index())
    events.process = jax.process_index()
    run(args.mesh_shape, args.mode, args.target_bytes_gib, args.cols, events)
    return 0
