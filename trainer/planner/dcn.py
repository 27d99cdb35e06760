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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainer.planner.hlo_text import (
    HloModule,
    arrays,
    as_module,
    frontend_attributes,
    replica_groups,
    target_ids,
    target_slice_list,
)

# libtpu numbers a multislice topology's devices (slice + 1) * 100000 + chip (tests/trainer/planner/
# test_dcn.py).
SLICE_ID_STRIDE = 100000

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
    return sum(a.nbytes for a in arrays(shape) if a.dims)


def target_slices(target: str, slice_of: Mapping[int, int] | None = None) -> int:
    """How many slices a megascale target spans: `{1,2}x{0:15}` lists them; `{{100000,...}}` lists global
    device ids (slice from `slice_of` when given, else libtpu's numbering)."""
    target = target.strip().strip('"')
    if (listed := target_slice_list(target)) is not None:
        return len(set(listed))
    ids = target_ids(target)
    return len({(slice_of or {}).get(i, i // SLICE_ID_STRIDE - 1) for i in ids}) or 1


def megascale_ops(hlo: str | HloModule, slice_of: Mapping[int, int] | None = None) -> list[DcnOp]:
    """The megascale host transfers of a compiled program, one per rendezvous (its send and recv), as often
    as it runs (one in a loop body as often as the loop runs)."""
    module = as_module(hlo)
    found: dict[str, dict] = {}
    # The bodies and conditions of the loops whose trip count cannot be read, each with its loop's body.
    open_loops = {part: loop.body for loop in module.loops if loop.trips is None
                  for part in (loop.body, loop.condition)}
    share = 1 / len(set(open_loops.values())) if open_loops else 0.0
    for computation, ins in module.instructions():
        if ins.op not in ("send", "recv") or "is_host_transfer=true" not in ins.attrs:
            continue
        attrs = frontend_attributes(ins.attrs)
        if "_xla_megascale_transfer_type" not in attrs:
            continue
        key = attrs.get("_xla_host_transfer_rendezvous") or ins.name
        entry = found.setdefault(key, {"send": 0, "recv": 0, "times": module.times(computation),
                                       "per_iteration": share if computation in open_loops else 0.0})
        entry["type"] = attrs["_xla_megascale_transfer_type"]
        entry["slices"] = target_slices(attrs.get("_xla_megascale_target", ""), slice_of)
        entry[ins.op] = _payload_bytes(ins.shape)
    return [
        DcnOp(KINDS.get(e["type"], e["type"].lower().replace("_", "-")), e["send"], e["recv"], e["slices"],
              e["per_iteration"])
        for e in found.values()
        for _ in range(e["times"])
    ]


# ---- replica groups that cross slices ---------------------------------------------------------------------


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
