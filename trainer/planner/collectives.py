"""The collectives inside a slice (ICI) of a compiled program: kind, bytes, group and where the group lies.

Read from the compiled HLO (trainer/planner/hlo_text.py). A synchronous collective names its result's shape
on its own line; an asynchronous one is a `-start`, which names the replica groups, and a `-done`, whose
shape is the result (tuples included). Each is counted as often as it runs (one in a loop body as often as
the loop runs; where a loop's trip count cannot be read, once) and priced by kind over the slice's torus by
trainer/planner/estimate.py. Pure: no JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from trainer.planner.hlo_text import (
    HloModule,
    arrays,
    as_module,
    names_mesh_axes,
    replica_group_size,
    replica_groups,
)

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def group_size(attrs: str, devices: int) -> int:
    """How many chips take part in one group of a collective, from its HLO attributes (all of them where
    the groups are empty or unreadable; 2 for a collective-permute, a transfer between a pair)."""
    return replica_group_size(attrs) or devices


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
    """Collectives in a compiled program, each counted as often as it runs. bytes: the size of each
    collective's result on one chip (an all-gather's gathered array, an all-reduce's reduced one, every array
    of a tuple), the data a chip receives. ops: each one with its group's size, for pricing by kind over the
    slice's torus (trainer/planner/estimate.py)."""

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


def collectives_in(
    hlo: str | HloModule,
    devices: int = 0,
    skip: Callable[[str, int, str], bool] | None = None,
    span: Callable[[str], tuple[int, ...]] | None = None,
) -> Collectives:
    """The collectives of a compiled program; `devices`: the slice's chip count, the group of a collective
    whose groups are empty; skip(kind, result bytes, attributes): leave one out (one that crosses slices is
    counted on the DCN, trainer/planner/dcn.py); span(attributes): where its groups lie on the torus
    (torus_span)."""
    module = as_module(hlo)
    found = Collectives()
    started: dict[str, str] = {}  # an async start's name -> its attributes (the groups are named there)
    for computation, ins in module.instructions():
        kind = ins.op.removesuffix("-start").removesuffix("-done")
        if kind not in KINDS:
            continue
        if ins.op.endswith("-start"):
            started[ins.name] = ins.attrs
            continue
        attrs = started.get(ins.operands[0], "") if ins.op.endswith("-done") and ins.operands else ins.attrs
        sizes = [a.nbytes for a in arrays(ins.shape)]
        nbytes = sum(sizes)
        if sizes and not (skip and skip(kind, nbytes, attrs)):
            found.add(kind, nbytes, group_size(attrs, devices), module.times(computation),
                      span(attrs) if span else ())
    return found


def torus_span(attrs: str, coords: Mapping[int, Sequence[int]]) -> tuple[int, ...]:
    """How far a collective's groups reach along each torus axis: per axis, the most chips any one group
    spans there (max - min + 1 of its chips' coordinates; its ring passes every chip between), from the
    replica groups (logical ids) and `coords` (logical id -> the chip's torus coordinates). Empty groups:
    every chip in `coords`. (): a spelling not read, or a chip without coordinates."""
    if not coords or names_mesh_axes(attrs):
        return ()
    groups = replica_groups(attrs) or [list(coords)]  # none: every chip
    if any(i not in coords for g in groups for i in g):
        return ()
    dims = len(next(iter(coords.values())))
    reach = [1] * dims
    for g in groups:
        for axis in range(dims):
            values = [coords[i][axis] for i in g]
            reach[axis] = max(reach[axis], max(values) - min(values) + 1)
    return tuple(reach)
