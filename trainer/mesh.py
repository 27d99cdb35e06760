"""The device mesh ("dp", "fsdp", "tp") and the batch shardings the train loop puts arrays in.

`mesh_shape` in the config:
- `auto`: full-device FSDP, `1,-1,1`. Fastest for decode-dominated GRPO even across hosts (the v6e-16
  full-FSDP benchmark). On N slices (Multislice) `N,-1,1`: data parallel over the slices (the DCN axis),
  full FSDP inside each slice.
- `host_local`: dp over processes, fsdp over each host's local devices (`process_count, local_count, 1`).
- `dp,fsdp,tp`: explicit sizes, one of them may be -1 (the remaining devices).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.mesh_shape import MeshError, resolve_mesh_shape

__all__ = ["AXES", "MeshError", "make_mesh", "resolve_mesh_shape", "slice_count"]

AXES = ("dp", "fsdp", "tp")
# Set by the TPU runtime on a Cloud multislice, by the console on local and ssh pods (docs/runs.md).
ENV_NUM_SLICES = "MEGASCALE_NUM_SLICES"


def slice_count(devices: Sequence[jax.Device]) -> int:
    """How many slices `devices` come from: TPU devices name theirs (`slice_index`); elsewhere (the CPU
    rehearsal of a multislice, whose devices all say slice 0) the launcher's MEGASCALE_NUM_SLICES says, 1
    when unset."""
    if any(d.platform == "tpu" for d in devices):
        return len({getattr(d, "slice_index", 0) for d in devices})
    raw = os.environ.get(ENV_NUM_SLICES, "").strip()
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        raise MeshError(f"{ENV_NUM_SLICES}={raw!r} is not a whole number; unset it or set the slice count") \
            from None


def _slice_of(device: jax.Device, process_count: int, num_slices: int) -> int:
    """A device's slice: its own on TPU; on CPU, processes are numbered slice by slice (launch order)."""
    if device.platform == "tpu":
        return getattr(device, "slice_index", 0)
    return device.process_index // (process_count // num_slices)


def make_mesh(mesh_shape: str, devices: Sequence[jax.Device] | None = None, *,
              topology_order: bool = False, num_slices: int | None = None) -> Mesh:
    """A Mesh with axes ("dp", "fsdp", "tp") over `devices` (default: all devices of all processes).

    topology_order: order several hosts' devices as mesh_utils does for the physical interconnect, instead
    of host-major. Only the planner uses it, to compare the two: the train loop's host<->device exchange
    needs each process's devices contiguous.

    num_slices (default: `slice_count(devices)`): on several slices the outer (dp) axis crosses them, slice
    0's devices first; with topology_order each slice is laid out for its ICI by create_hybrid_device_mesh."""
    devices = list(jax.devices() if devices is None else devices)
    process_count = len({d.process_index for d in devices})
    num_slices = slice_count(devices) if num_slices is None else num_slices
    dp, fsdp, tp = resolve_mesh_shape(mesh_shape, len(devices), process_count, num_slices)
    if num_slices > 1 and topology_order:
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_hybrid_device_mesh((dp // num_slices, fsdp, tp), (num_slices, 1, 1),
                                                    devices=devices)
    elif num_slices > 1:
        # Slice-major, then process-contiguous (as below): dp's outer blocks are whole slices, so only the
        # data-parallel gradient reduction crosses the data-center network.
        ordered = sorted(devices, key=lambda d: (_slice_of(d, process_count, num_slices), d.process_index,
                                                 d.id))
        grid = np.array(ordered, dtype=object).reshape(dp, fsdp, tp)
    elif process_count == 1 or topology_order:
        # One host: let JAX order devices for the physical interconnect.
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh((dp, fsdp, tp), devices=devices)
    else:
        # Several hosts: keep each process's devices contiguous in mesh order so that a process's rows of a
        # batch sharded over all axes are one block (what make_array_from_process_local_data expects) and
        # host_local's dp axis is exactly the process axis.
        ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
        grid = np.array(ordered, dtype=object).reshape(dp, fsdp, tp)
    return Mesh(grid, AXES)


def fsdp_spans_hosts(mesh: Mesh) -> bool:
    """True when one fsdp group holds devices of more than one process (cross-host collectives in play)."""
    grid = mesh.devices
    for i in range(grid.shape[0]):
        for k in range(grid.shape[2]):
            if len({d.process_index for d in grid[i, :, k]}) > 1:
                return True
    return False


def axis_sizes(mesh: Mesh) -> dict[str, int]:
    return {name: int(size) for name, size in mesh.shape.items()}


# Batch layouts. Training and the host<->device exchange use batch-over-all-axes, process-contiguous rows.
def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batch dimension split over every device (each process owns a contiguous block of rows)."""
    return NamedSharding(mesh, PartitionSpec(AXES))


def train_sharding(mesh: Mesh) -> NamedSharding:
    """Training batch over (dp, fsdp); tp shards the model, not the batch."""
    return NamedSharding(mesh, PartitionSpec(("dp", "fsdp")))


# Host <-> global arrays. Each process holds its own rows of every batch (its prompts, their completions).
def global_from_local_rows(local: np.ndarray, mesh: Mesh, sharding: NamedSharding | None = None) -> jax.Array:
    """One global array from every process's `local` rows (stacked in process order), laid out as
    `sharding`."""
    array = jax.make_array_from_process_local_data(batch_sharding(mesh), np.asarray(local))
    return array if sharding is None else reshard(array, sharding)


def local_rows(array: jax.Array, mesh: Mesh) -> np.ndarray:
    """This process's rows of a global batch array, as NumPy (the inverse of global_from_local_rows)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    laid_out = reshard(array, batch_sharding(mesh))
    shards = sorted(laid_out.addressable_shards, key=lambda s: s.index[0].start or 0)
    return np.concatenate([np.asarray(s.data) for s in shards], axis=0)


def reshard(tree: object, sharding: NamedSharding) -> object:
    """Move arrays to `sharding` (a collective when rows change owner; a no-op when already there)."""
    return _reshard_fn(sharding)(tree)


_RESHARD_FNS: dict[NamedSharding, object] = {}


def _reshard_fn(sharding: NamedSharding):  # one jitted identity per target layout, reused every step
    if sharding not in _RESHARD_FNS:
        _RESHARD_FNS[sharding] = jax.jit(lambda x: x, out_shardings=sharding)
    return _RESHARD_FNS[sharding]
