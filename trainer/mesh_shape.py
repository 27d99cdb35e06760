"""What `mesh_shape` means on a given device and process count: the (dp, fsdp, tp) sizes, or why it does not
fit. Pure (no JAX), so the console can check a config against a node's shape before anything is sent."""

from __future__ import annotations

import math


class MeshError(ValueError):
    """A mesh_shape that does not fit the devices; the message names mesh_shape and the fix."""


def resolve_mesh_shape(mesh_shape: str, device_count: int, process_count: int,
                       num_slices: int = 1) -> tuple[int, int, int]:
    """The (dp, fsdp, tp) sizes `mesh_shape` means on `device_count` devices over `process_count` hosts in
    `num_slices` slices (Multislice). Across slices only data parallelism goes over the data-center network
    (DCN): `auto` puts dp = num_slices on the outer axis and fsdp over each slice's devices, and an explicit
    shape must have dp a multiple of num_slices."""
    if num_slices > 1 and (process_count % num_slices or device_count % num_slices):
        raise MeshError(f"mesh_shape: {process_count} processes / {device_count} devices do not split into "
                        f"{num_slices} equal slices; check MEGASCALE_NUM_SLICES and launch on every worker")
    sizes = _resolve(mesh_shape, device_count, process_count, num_slices)
    if sizes[0] % num_slices:
        raise MeshError(f"mesh_shape: {mesh_shape} has dp={sizes[0]}, which cannot span {num_slices} slices "
                        f"(only data parallelism crosses the data-center network); make dp a multiple of "
                        f"{num_slices}, e.g. {num_slices},-1,1, or use auto")
    return sizes


def _resolve(mesh_shape: str, device_count: int, process_count: int, num_slices: int) -> tuple[int, int, int]:
    if mesh_shape == "auto":
        return num_slices, device_count // num_slices, 1
    if mesh_shape == "host_local":
        if device_count % process_count:
            raise MeshError(f"mesh_shape: host_local needs the same device count on every process "
                            f"({device_count} devices, {process_count} processes); use auto")
        return process_count, device_count // process_count, 1
    try:
        sizes = [int(x) for x in mesh_shape.split(",")]
    except ValueError:
        raise MeshError(f"mesh_shape: {mesh_shape!r} is not auto, host_local or dp,fsdp,tp") from None
    if len(sizes) != 3 or sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise MeshError(f"mesh_shape: {mesh_shape!r} must be three positive sizes dp,fsdp,tp "
                        "with at most one -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if device_count % known:
            raise MeshError(f"mesh_shape: {mesh_shape} cannot fill {device_count} devices (the fixed axes "
                            f"multiply to {known}); use sizes whose product divides {device_count}")
        sizes[sizes.index(-1)] = device_count // known
    elif known != device_count:
        raise MeshError(f"mesh_shape: {mesh_shape} uses {known} devices but there are {device_count}; "
                        f"make dp*fsdp*tp = {device_count} or use -1 for one axis")
    return sizes[0], sizes[1], sizes[2]
