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
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.distributed import has_tpu_chips
from trainer.planner.hbm_traffic import arrays, hbm_traffic
from trainer.planner.tpu_specs import TpuSlice
from trainer.planner.whole_cost import computation_header, computation_runs, whole_cost


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


# HLO collectives. A synchronous one names its result's shape on its own line; an async one is a -start
# (which names the replica groups) and a -done (whose shape is the result, tuples included).
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s"
    r"(?P<op>all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)(?P<phase>-start|-done)?"
    r"\((?P<operands>[^)]*)\)(?P<attrs>.*)$"
)
# Replica groups in the three spellings XLA prints: explicit lists, iota ([groups,size]<=[n]) and named mesh
# axes (mesh['axis_0'=4,'axis_1'=4] {'axis_1'}: the group is the named axes).
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{\{(?P<first>[\d,]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(?P<dims>[\d,]+)\]<=")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\](?P<rest>.*)")
_MESH_AXIS = re.compile(r"'(?P<name>[^']+)'=(?P<size>\d+)")
_MESH_NAMES = re.compile(r"\{(?P<names>'[^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=")


def _array_bytes(text: str) -> list[int]:
    """The bytes of every array of an HLO shape (a tuple's, in order)."""
    return [array.nbytes for array in arrays(text)]


def group_size(attrs: str, devices: int) -> int:
    """How many chips take part in one group of a collective, from its HLO attributes (all of them where
    the groups are empty or unreadable; 2 for a collective-permute, a transfer between a pair)."""
    if _PAIRS.search(attrs):
        return 2
    if m := _EXPLICIT_GROUPS.search(attrs):
        first = [x for x in m.group("first").split(",") if x]
        return len(first) or devices
    if m := _IOTA_GROUPS.search(attrs):
        return int(m.group("dims").split(",")[-1])
    if m := _MESH_GROUPS.search(attrs):
        sizes = {a.group("name"): int(a.group("size")) for a in _MESH_AXIS.finditer(m.group("axes"))}
        names = _MESH_NAMES.search(m.group("rest"))
        chosen = [n.strip().strip("'") for n in names.group("names").split(",")] if names else list(sizes)
        return math.prod(sizes.get(n, 1) for n in chosen)
    return devices


@dataclass(frozen=True)
class CollectiveOp:
    """One collective as the HLO names it: its kind, the bytes of its result on one chip (every array of a
    tuple), how many chips are in its group, and where the group lies on the torus: the extent of its
    chips along each torus axis (span; () where the chips' coordinates are unknown)."""

    kind: str
    result_bytes: int
    group: int
    span: tuple[int, ...] = ()


@dataclass
class Collectives:
    """Collectives in a compiled program, each counted as often as it runs (one in a loop body as often as the
    loop runs, trainer/planner/whole_cost.py; where a loop's trip count cannot be read, once). bytes: the size
    of each collective's result on one chip (an all-gather's gathered array, an
    all-reduce's reduced one, every array of a tuple), the data a chip receives. ops: each one with its
    group's size, for pricing by kind over the slice's torus (trainer/planner/estimate.py)."""

    count: int = 0
    bytes: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [count, bytes]
    ops: list[CollectiveOp] = field(default_factory=list)

    def add(self, kind: str, nbytes: int, group: int = 0, times: int = 1, span: tuple[int, ...] = ()) -> None:
        self.count += times
        self.bytes += nbytes * times
        entry = self.by_kind.setdefault(kind, [0, 0])
        entry[0] += times
        entry[1] += nbytes * times
        self.ops.extend([CollectiveOp(kind, nbytes, group, span)] * times)

    def grouped(self) -> list[list]:
        """[kind, result bytes, group, count] for each distinct op, and its span where known (a fifth
        element, a list): the JSON form (thousands of ops a program come down to tens of rows)."""
        counts: dict[CollectiveOp, int] = {}
        for op in self.ops:
            counts[op] = counts.get(op, 0) + 1
        return [[op.kind, op.result_bytes, op.group, n, *([list(op.span)] if op.span else [])]
                for op, n in counts.items()]


def collectives_in(hlo_text: str, devices: int = 0, skip: Callable[[str, int, str], bool] | None = None,
                   span: Callable[[str], tuple[int, ...]] | None = None) -> Collectives:
    """The collectives of a compiled program's HLO text; `devices`: the slice's chip count, the group of a
    collective whose groups are empty; skip(kind, result bytes, attributes): leave one out (one that crosses
    slices is counted on the DCN, trainer/planner/dcn.py); span(attributes): where its groups lie on the torus
    (torus_span)."""
    found = Collectives()
    started: dict[str, str] = {}  # an async start's name -> its attributes (the groups are named there)
    runs, computation = computation_runs(hlo_text), ""
    for line in hlo_text.splitlines():
        if header := computation_header(line):
            computation = header
            continue
        m = _COLLECTIVE.search(line)
        if not m:
            continue
        if m.group("phase") == "-start":
            started[m.group("name")] = m.group("attrs")
            continue
        attrs = m.group("attrs")
        if m.group("phase") == "-done":
            attrs = started.get(m.group("operands").strip().lstrip("%"), "")
        sizes = _array_bytes(m.group("shape"))
        if sizes and not (skip and skip(m.group("op"), sum(sizes), attrs)):
            found.add(m.group("op"), sum(sizes), group_size(attrs, devices), max(runs.get(computation, 1), 1),
                      span(attrs) if span else ())
    return found


def torus_span(attrs: str, coords: Mapping[int, Sequence[int]]) -> tuple[int, ...]:
    """How far a collective's groups reach along each torus axis: per axis, the most chips any one group
    spans there (max - min + 1 of its chips' coordinates; its ring passes every chip between), from the
    replica groups (logical ids) and `coords` (logical id -> the chip's torus coordinates). Empty groups:
    every chip in `coords`. (): a spelling not read, or a chip without coordinates."""
    from trainer.planner import dcn

    if not coords:
        return ()
    if "replica_groups=mesh[" in attrs:
        return ()  # named mesh axes: not read here
    groups = dcn.replica_groups(attrs) or [list(coords)]  # none: every chip
    if any(i not in coords for g in groups for i in g):
        return ()
    dims = len(next(iter(coords.values())))
    reach = [1] * dims
    for g in groups:
        for axis in range(dims):
            values = [coords[i][axis] for i in g]
            reach[axis] = max(reach[axis], max(values) - min(values) + 1)
    return tuple(reach)


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
    hlo_text = compiled.as_text()
    # cost_analysis() counts a loop's body once: the micro-batch loop and scanned layers as often as they run.
    whole = whole_cost(hlo_text, float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))
    program = CompiledProgram(
        name,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        flops=whole.flops,
        bytes_accessed=whole.bytes_accessed,
        hbm_traffic_bytes=hbm_traffic(hlo_text).bytes,
        counted_flops=float(cost.get("flops", 0.0)),
        loop_trips=whole.trip_counts,
        compiler_seconds=_compiler_seconds(cost),
        **_split_by_slice(hlo_text, args),
        compile_s=time.perf_counter() - start,
        output_shardings=compiled.output_shardings,
    )
    del compiled
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
    return program


def _split_by_slice(hlo_text: str, args: Any) -> dict:
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
        return {"collectives": collectives_in(hlo_text, per_slice, span=span), "dcn": []}
    crossing: list = []

    def skip(kind: str, nbytes: int, attrs: str) -> bool:
        op = dcn.crossing_op(kind, nbytes, attrs, slice_of, len(assignment))
        if op is not None:
            crossing.append(op)
        return op is not None

    ici = collectives_in(hlo_text, per_slice, skip, span)
    global_ids = {d.id: getattr(d, "slice_index", 0) or 0 for d in assignment}
    return {"collectives": ici, "dcn": crossing + dcn.megascale_ops(hlo_text, global_ids)}


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
