"""Ahead-of-time compilation for a TPU slice on any Linux x86-64 host, with the compiler's own analysis.

libtpu (the `libtpu` wheel `jax[tpu]` pins) compiles for a TPU topology without a TPU: `tpu_devices` gives
a slice's devices to build a mesh on, `compile_program` lowers a jitted function with abstract arguments and
returns the TPU executable's `memory_analysis()` (per-chip argument, output, temporary and alias bytes),
`cost_analysis()` (flops, bytes accessed, the compiler's own optimal time; loops counted as often as they
run, trainer/planner/whole_cost.py), the bytes that cross HBM (trainer/planner/hbm_traffic.py) and the
collectives in the compiled HLO, or the compiler's out-of-memory answer.
MaxText's `train_compile` works the same way.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer.distributed import has_tpu_chips
from trainer.planner.collectives import Collectives, collectives_in, torus_span
from trainer.planner.hbm_traffic import hbm_traffic
from trainer.planner.hlo_text import HloModule, parse_hlo
from trainer.planner.tpu_specs import TpuSlice
from trainer.planner.whole_cost import whole_cost


class LibtpuUnavailable(RuntimeError):
    """libtpu cannot be loaded here; the message says why and how to get it."""


def libtpu_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("libtpu")
    except Exception:  # noqa: BLE001 - absent or unreadable metadata both mean "not installed"
        return None


@functools.cache
def tpu_devices(tpu: TpuSlice, slices: int = 1) -> tuple:
    """The slice's TPU devices, in the topology's order (nothing is allocated; no TPU is needed); on `slices`
    slices (Multislice) every slice's, each device naming its `slice_index`."""
    import platform

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise LibtpuUnavailable(
            f"planning needs libtpu, which is published for Linux x86-64 only (this is "
            f"{platform.system()} {platform.machine()}); run plan on a Linux x86-64 machine"
        )
    if libtpu_version() is None:
        from importlib.metadata import version

        raise LibtpuUnavailable(
            f'libtpu is not installed; pip install "jax[tpu]=={version("jax")}" (about 700 MB; '
            "scripts/console installs it, the `plan` extra) to plan without a TPU"
        )
    # Off a TPU VM: skip the metadata server and name the accelerator, so libtpu does not go looking.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", tpu.accelerator_type)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    if not has_tpu_chips():
        # Compiling only: several planners (a test run beside a benchmark) may hold libtpu at once. On a TPU
        # VM the lockfile keeps guarding the chips.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    try:
        desc = topologies.get_topology_desc(
            platform="tpu",
            topology_name=tpu.topology_name,
            chip_config_name=tpu.generation.chip_config,
            chips_per_host_bounds=tpu.chips_per_host_bounds,
            num_slices=slices,
        )
    except Exception as exc:  # noqa: BLE001 - libtpu's errors are RuntimeErrors of many shapes
        raise LibtpuUnavailable(
            f"libtpu cannot describe {tpu.topology_name}: {str(exc).splitlines()[0]}"
        ) from None
    return tuple(desc.devices)


@dataclass
class CompiledProgram:
    """One program compiled for a TPU slice: the compiler's per-chip memory and cost, or its OOM answer."""

    name: str
    argument_bytes: int = 0
    output_bytes: int = 0
    temp_bytes: int = 0
    alias_bytes: int = 0
    code_bytes: int = 0
    flops: float = 0.0
    bytes_accessed: float = 0.0
    # What crosses HBM, read from the compiled HLO by memory space (trainer/planner/hbm_traffic.py): an upper
    # bound of the real traffic, where bytes_accessed also counts on-chip copies (a prefetched weight ~5
    # times).
    hbm_traffic_bytes: float = 0.0
    compiler_seconds: float | None = None  # the TPU compiler's own 'optimal_seconds' estimate
    # flops and bytes_accessed count every loop as often as it runs (trainer/planner/whole_cost.py);
    # counted_flops is cost_analysis()' own figure (each loop body once), loop_trips each while loop's trips
    # (None: unknown).
    counted_flops: float = 0.0
    loop_trips: list = field(default_factory=list)
    collectives: Collectives = field(default_factory=Collectives)
    dcn: list = field(default_factory=list)  # trainer/planner/dcn.py DcnOps: what crosses slices, per chip
    oom: str | None = None  # the compiler's out-of-memory message, when it could not fit the program
    compile_s: float = 0.0
    output_shardings: Any = None  # of the executable's outputs (the next program's inputs are laid out so)

    @property
    def peak_bytes(self) -> int:
        """What the program holds at once on one chip: its arguments, outputs that do not reuse an
        argument's buffer, its temporaries and its code."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes + self.code_bytes


def is_out_of_memory(message: str) -> bool:
    return (
        "RESOURCE_EXHAUSTED" in message
        or "Ran out of memory" in message
        or "out of memory" in message.lower()
    )


def oom_summary(message: str) -> str:
    """The line of the compiler's answer that says what did not fit."""
    for line in message.splitlines():
        if "Ran out of memory" in line or "exceeds" in line:
            return line.strip()
    return message.strip().splitlines()[0]


def compile_program(name: str, fn: Callable, *args: Any, **kwargs: Any) -> CompiledProgram:
    """Lower the jitted `fn` with abstract arguments (ShapeDtypeStructs carrying shardings) and compile it.
    Only the figures are kept: the executable (gigabytes of host memory for a 7B model) is dropped, and so
    are JAX's caches of the traced program."""
    import time

    start = time.perf_counter()
    try:
        compiled = fn.lower(*args, **kwargs).compile()
    except Exception as exc:
        if is_out_of_memory(str(exc)):
            return CompiledProgram(name, oom=oom_summary(str(exc)), compile_s=time.perf_counter() - start)
        raise
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0] if cost else {}
    hlo = parse_hlo(compiled.as_text())
    # cost_analysis() counts a loop's body once: the micro-batch loop and scanned layers as often as they run.
    whole = whole_cost(hlo, float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))
    program = CompiledProgram(
        name,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        flops=whole.flops,
        bytes_accessed=whole.bytes_accessed,
        hbm_traffic_bytes=hbm_traffic(hlo).bytes,
        counted_flops=float(cost.get("flops", 0.0)),
        loop_trips=whole.trip_counts,
        compiler_seconds=_compiler_seconds(cost),
        **_split_by_slice(hlo, args),
        compile_s=time.perf_counter() - start,
        output_shardings=compiled.output_shardings,
    )
    del compiled
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    return program


def _split_by_slice(hlo: HloModule, args: Any) -> dict:
    """The program's collectives inside a slice (ICI) and what crosses slices (DCN: megascale transfers, and
    any collective whose replica groups span slices), with logical device ids mapped to slices through the
    device assignment (the first sharded argument's, as jit takes it)."""
    import jax

    from trainer.planner import dcn

    assignment: list = []
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None:
            assignment = list(getattr(sharding, "_device_assignment", None) or
                              sorted(sharding.device_set, key=lambda d: d.id))
            break
    slice_of = {i: getattr(d, "slice_index", 0) or 0 for i, d in enumerate(assignment)}
    slices = len(set(slice_of.values())) or 1
    per_slice = len(assignment) // slices
    # Each chip's place on its slice's torus, for pricing a collective by where its group lies.
    coords = {i: tuple(d.coords) for i, d in enumerate(assignment) if getattr(d, "coords", None) is not None}
    coords = coords if len(coords) == len(assignment) else {}
    span = functools.partial(torus_span, coords=coords) if coords else None
    if slices == 1:
        return {"collectives": collectives_in(hlo, per_slice, span=span), "dcn": []}
    crossing: list = []

    def skip(kind: str, nbytes: int, attrs: str) -> bool:
        op = dcn.crossing_op(kind, nbytes, attrs, slice_of, len(assignment))
        if op is not None:
            crossing.append(op)
        return op is not None

    ici = collectives_in(hlo, per_slice, skip, span)
    global_ids = {d.id: getattr(d, "slice_index", 0) or 0 for d in assignment}
    return {"collectives": ici, "dcn": crossing + dcn.megascale_ops(hlo, global_ids)}


def _compiler_seconds(cost: dict) -> float | None:
    """The compiler's own time estimate; libtpu reports a negative number when it has none."""
    seconds = cost.get("optimal_seconds")
    return None if seconds is None or seconds < 0 else float(seconds)


_AVAILABLE = re.compile(r"exceeds available HBM \(([\d.]+)([KMGT])\)|available HBM[^\d]*([\d.]+)([KMGT])")
_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


@functools.cache
def hbm_limit_bytes(tpu: TpuSlice) -> int:
    """The HBM one chip's programs may use, in the compiler's own words: compile a program that cannot fit
    and read the limit from its answer. Falls back to the published capacity if the answer has no number."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    device = tpu_devices(tpu)[0]
    mesh = jax.sharding.Mesh([device], ("x",))
    huge = jax.ShapeDtypeStruct(
        (64, 1024, 1024, 1024), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec())
    )
    try:
        jax.jit(lambda x: x * 2 + jnp.flip(x)).lower(huge).compile()
    except Exception as exc:  # noqa: BLE001 - the OOM answer is what we asked for
        m = _AVAILABLE.search(str(exc))
        if m:
            number, unit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            return int(float(number) * _UNITS[unit])
    return int(tpu.generation.hbm_bytes)
