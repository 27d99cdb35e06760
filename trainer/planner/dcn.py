"""Collectives that cross slices (Multislice): found in a compiled program's HLO, counted in bytes on the
data-center network (DCN) per chip.

Pure (no JAX), like trainer/planner/estimate.py, which prices what this finds.

What libtpu compiles for N slices (`get_topology_desc(..., num_slices=N)`) is one program per slice: its
collectives' replica groups name the slice's own chips (ICI), and what must cross slices leaves as a pair of
host transfers for the megascale runtime, `send`/`recv` with `is_host_transfer=true` and frontend attributes
naming the operation and the chips in it:

    %send = (f32[64,8,128], u32[], token[]) send(%x, %t), is_host_transfer=true, frontend_attributes={
        _xla_host_transfer_rendezvous="all-reduce.1_0", _xla_megascale_transfer_type="ALL_REDUCE",
        _xla_megascale_target="{1,2}x{0:15}", ...}

The target is either `{slices}x{first:last chip}` (each chip with the same chip of every listed slice) or
the chips' global ids, `{{100000,...,200003}}`, whose slice is `id // 100000 - 1` (the ids the topology's
devices carry). The payload of an all-reduce is the chip's share after the slice's own reduce-scatter over
ICI (a 4 MB gradient on 16 chips sends 256 KB a chip), so the compiler's hierarchy is already in the bytes.

A collective written with replica groups that span slices (never seen in a compiled multislice program, but
a program compiled without megascale would show it) is counted here too, by the slices its groups span, as
the hierarchical algorithm would move it: inside each slice over ICI, across slices 1/m of it per chip (m
chips of the group in each slice).

Bytes on the wire per chip for k slices, from the payload S one chip sends (R: what it receives):
all-reduce 2(k-1)/k S; all-gather (k-1)/k R; reduce-scatter and all-to-all (k-1)/k S; anything else S.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainer.planner.whole_cost import computation_header, computation_runs, loops

# libtpu numbers a multislice topology's devices (slice + 1) * 100000 + chip (tests/trainer/test_dcn.py).
SLICE_ID_STRIDE = 100000

_HOST_TRANSFER = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s(?P<op>send|recv)\((?P<rest>.*)$"
)
_ATTR = re.compile(r'(?P<key>_xla_[a-z_]+)=(?P<value>"[^"]*"|\{\{[\d,{} ]*\}\})')
_ARRAY = re.compile(r"(?P<dtype>pred|s8|u8|s16|u16|f16|bf16|s32|u32|f32|s64|u64|f64)\[(?P<dims>[\d,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
             "f32": 4, "s64": 8, "u64": 8, "f64": 8}
_SLICES_BY_RANGE = re.compile(r"^\{(?P<slices>[\d,]+)\}x")
_GROUP = re.compile(r"\{(?P<ids>[\d,\s]+)\}")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{(?P<body>(?:\{[\d,]*\},?)*)\}")
_IOTA_GROUPS = re.compile(
    r"replica_groups=\[(?P<shape>[\d,]+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?"
)
_PAIRS = re.compile(r"source_target_pairs=\{(?P<body>(?:\{\d+,\d+\},?)*)\}")

KINDS = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather", "REDUCE_SCATTER": "reduce-scatter",
         "ALL_TO_ALL": "all-to-all"}


@dataclass(frozen=True)
class DcnOp:
    """One transfer across slices, per chip: its kind, the bytes a chip sends and receives, the slices in
    its group, and the bytes it puts on the DCN (`wire_bytes`)."""

    kind: str
    send_bytes: int
    recv_bytes: int
    slices: int
    # In a loop whose length the compiler cannot know (the decode loop runs until every row has ended): how
    # often it runs an iteration, 1/n over the program's n such loops (each token runs one of them, the
    # length buckets); 0 elsewhere. The program counts it once; the step multiplies it by the tokens.
    per_iteration: float = 0.0

    @property
    def wire_bytes(self) -> float:
        return wire_bytes(self.kind, self.send_bytes, self.recv_bytes, self.slices)


def wire_bytes(kind: str, send: float, recv: float, slices: int) -> float:
    """Bytes one chip sends over the DCN for a transfer among `slices` slices (module docstring)."""
    k = max(slices, 1)
    if k == 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (k - 1) / k * send
    if kind == "all-gather":
        return (k - 1) / k * (recv or send * k)
    if kind in ("reduce-scatter", "all-to-all"):
        return (k - 1) / k * send
    return float(send or recv)


def _payload_bytes(shape: str) -> int:
    """The buffer of a send/recv's tuple: every array but the scalars the runtime adds (u32[], token[])."""
    total = 0
    for m in _ARRAY.finditer(shape):
        dims = [int(d) for d in m.group("dims").split(",") if d]
        if dims:
            count = 1
            for d in dims:
                count *= d
            total += count * _ITEMSIZE[m.group("dtype")]
    return total


def target_slices(target: str, slice_of: Mapping[int, int] | None = None) -> int:
    """How many slices a megascale target spans: `{1,2}x{0:15}` lists them; `{{100000,...}}` lists global
    device ids (slice from `slice_of` when given, else libtpu's numbering)."""
    target = target.strip().strip('"')
    if m := _SLICES_BY_RANGE.match(target):
        return len({s for s in m.group("slices").split(",") if s})
    ids = [int(x) for g in _GROUP.finditer(target) for x in g.group("ids").replace(" ", "").split(",") if x]
    return len({(slice_of or {}).get(i, i // SLICE_ID_STRIDE - 1) for i in ids}) or 1


def megascale_ops(hlo_text: str, slice_of: Mapping[int, int] | None = None) -> list[DcnOp]:
    """The megascale host transfers of a compiled program, one per rendezvous (its send and recv), as often
    as it runs (one in a loop body as often as the loop runs, trainer/planner/whole_cost.py)."""
    found: dict[str, dict] = {}
    runs, computation = computation_runs(hlo_text), ""
    open_loops = _open_loop_parts(hlo_text)
    share = 1 / len(set(open_loops.values())) if open_loops else 0.0
    for line in hlo_text.splitlines():
        if header := computation_header(line):
            computation = header
            continue
        if "is_host_transfer=true" not in line or "_xla_megascale_transfer_type" not in line:
            continue
        m = _HOST_TRANSFER.search(line)
        if not m:
            continue
        attrs = {a.group("key"): a.group("value").strip('"') for a in _ATTR.finditer(m.group("rest"))}
        key = attrs.get("_xla_host_transfer_rendezvous") or m.group("name")
        entry = found.setdefault(key, {"send": 0, "recv": 0, "times": max(runs.get(computation, 1), 1),
                                       "per_iteration": share if computation in open_loops else 0.0})
        entry["type"] = attrs.get("_xla_megascale_transfer_type", "")
        entry["slices"] = target_slices(attrs.get("_xla_megascale_target", ""), slice_of)
        entry[m.group("op")] = _payload_bytes(m.group("shape"))
    return [
        DcnOp(KINDS.get(e["type"], e["type"].lower().replace("_", "-")), e["send"], e["recv"], e["slices"],
              e["per_iteration"])
        for e in found.values()
        for _ in range(e["times"])
    ]


def _open_loop_parts(hlo_text: str) -> dict[str, str]:
    """The bodies and conditions of the while loops whose trip count cannot be read, each mapped to its
    loop's body (the loop's name here)."""
    found, _ = loops(hlo_text)
    return {part: loop.body for loop in found if loop.trips is None for part in (loop.body, loop.condition)}


# ---- replica groups that cross slices ---------------------------------------------------------------------


def replica_groups(attrs: str) -> list[list[int]] | None:
    """A collective's groups of logical device ids, from the explicit (`{{0,1},{2,3}}`) or iota
    (`[2,4]<=[4,2]T(1,0)`) spelling; pairs for a collective-permute; None when empty (every device) or in a
    spelling not read here (named mesh axes)."""
    if m := _PAIRS.search(attrs):
        return [[int(a), int(b)] for a, b in re.findall(r"\{(\d+),(\d+)\}", m.group("body"))]
    if m := _EXPLICIT_GROUPS.search(attrs):
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group("body"))]
        groups = [g for g in groups if g]
        return groups or None
    if m := _IOTA_GROUPS.search(attrs):
        shape = [int(x) for x in m.group("shape").split(",")]
        dims = [int(x) for x in m.group("dims").split(",")]
        perm = [int(x) for x in m.group("perm").split(",")] if m.group("perm") else list(range(len(dims)))
        ids = _iota(dims, perm)
        size = shape[-1]
        return [ids[i:i + size] for i in range(0, len(ids), size)]
    return None


def _iota(dims: Sequence[int], perm: Sequence[int]) -> list[int]:
    """range(prod(dims)) reshaped to `dims`, transposed by `perm`, flattened (XLA's iota replica groups)."""
    total = 1
    for d in dims:
        total *= d
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    shape = [dims[p] for p in perm]
    out = []
    for flat in range(total):
        index, rest = [], flat
        for d in reversed(shape):
            index.append(rest % d)
            rest //= d
        index.reverse()
        out.append(sum(index[axis] * strides[perm[axis]] for axis in range(len(perm))))
    return out


def slices_spanned(groups: Iterable[Sequence[int]], slice_of: Mapping[int, int]) -> int:
    """The most slices any one group spans (1: the collective stays inside a slice, on ICI)."""
    return max((len({slice_of.get(i, 0) for i in g}) for g in groups), default=1)


def crossing_op(kind: str, result_bytes: int, attrs: str, slice_of: Mapping[int, int],
                devices: int) -> DcnOp | None:
    """The DCN part of an ICI-spelled collective whose groups span slices, None when it stays in a slice.
    Its group of n chips over k slices moves 1/m of its data per chip across slices (m = n / k). Empty
    groups and the named-mesh spelling stay in the slice: libtpu's multislice program is one slice's, where
    they name that slice's chips (`devices` is kept for a caller that knows better)."""
    groups = replica_groups(attrs)
    if groups is None:
        return None
    k = slices_spanned(groups, slice_of)
    if k <= 1:
        return None
    n = max(len(g) for g in groups)
    m = max(n // k, 1)
    if kind == "all-reduce":
        return DcnOp(kind, result_bytes // m, result_bytes // m, k)
    if kind == "all-gather":
        return DcnOp(kind, result_bytes // n, result_bytes // m, k)
    if kind == "reduce-scatter":  # the chip's piece R: (k-1) R per chip after the slice's own reduce
        return DcnOp(kind, result_bytes * k, result_bytes, k)
    return DcnOp(kind, result_bytes, result_bytes, k)  # all-to-all: (k-1)/k R; a permute: R


# ---- a program's figures, grouped for JSON --------------------------------------------------------------


def grouped(ops: Iterable[DcnOp]) -> list[list]:
    """[kind, send bytes, recv bytes, slices, count, per iteration] for each distinct op (the plan's
    JSON)."""
    counts: dict[DcnOp, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return [[op.kind, op.send_bytes, op.recv_bytes, op.slices, n, op.per_iteration]
            for op, n in counts.items()]


def per_token(rows: Iterable[Sequence]) -> list[list]:
    """Of grouped rows, those that run every iteration of an open-ended loop, as rows whose count is their
    runs a token (the decode loop's wait on the other slices: does any row go on?)."""
    return [[*row[:4], row[4] * row[5]] for row in rows if len(row) > 5 and row[5]]


def ops_wire_bytes(rows: Iterable[Sequence]) -> float:
    """Bytes a chip puts on the DCN for grouped rows ([kind, send, recv, slices, count, ...])."""
    return sum(wire_bytes(kind, send, recv, slices) * count for kind, send, recv, slices, count, *_ in rows)
