"""The bytes a compiled TPU program moves across HBM, read from its HLO: an upper bound of the real traffic.

XLA's `cost_analysis()` "bytes accessed" counts every operand and result of every instruction, whatever
memory it lives in. On a TPU, memory-space assignment prefetches weights into on-chip memory
(`copy-start`/`copy-done`, `slice-start`), so a weight one matmul streams is counted about five times: the
prefetch's read, its tuple result (which names the source again), the `copy-done`, and the matmul's read of
the on-chip copy (benchmarks/plan.py `--part weight-count`: 5.04x). HBM is read once.

Here the compiled HLO (`compiled.as_text()`) is read instead. libtpu prints each array's memory space in its
layout: `bf16[2048,2752]{0,1:T(8,128)(2,1)S(1)}` is on chip (S(1) the alternate memory, S(2) sync flags,
S(6) scalar memory); an array without `S(n)` (or with S(0)) is in HBM. Every instruction of every computation
that runs (the entry, loop bodies and conditions, branches, called computations; fusions are analysed as one
instruction) is charged

- its operands that are in HBM, each in full, and its results that are in HBM (a fusion reads every HBM
  operand in full each time it runs), except:
- a slice (`slice`, `dynamic-slice`, `slice-start`, or a fusion parameter used only by slices, there or in
  a fusion it nests: a scanned layer's weight) reads only the slice; an in-place `dynamic-update-slice`
  (alone or at a fusion's root) writes only its update;
- an asynchronous pair is charged once: a `-start` its operands in HBM, its `-done` its result in HBM. A
  prefetch HBM -> chip is one HBM read; an eviction chip -> HBM one HBM write;
- what moves nothing: parameters, constants, tuples and their elements, bitcasts, the loop and branch
  instructions themselves (their computations are charged).

Each computation is charged as often as it runs (trainer/planner/hlo_text.py: a loop body by its trip count;
a loop of unknown length, the decode loop, once). Pure text processing: no JAX.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainer.planner.hlo_text import HloModule, Instruction, arrays, as_module, shape_bytes, tuple_elements

FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
    "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
}
SLICES = {"slice", "dynamic-slice"}


def _hbm(shape: str) -> int:
    return sum(a.nbytes for a in arrays(shape) if a.space == 0)


@dataclass
class FusedBody:
    """What a fused computation reads of each parameter and writes of its results."""

    reads: dict[int, int | None]  # parameter number -> bytes read when only slices of it are (None: all)
    writes: list[int | None]  # per result array: bytes written in place (None: the whole result)


class Fusions:
    """What each fused computation reads of its parameters and writes of its results, looking into the
    fusions it nests (a scanned layer's weight is often sliced by a nested fusion)."""

    def __init__(self, parsed: dict[str, list[Instruction]]):
        self.parsed = parsed
        self.memo: dict[str, FusedBody] = {}

    def body(self, name: str) -> FusedBody | None:
        if name not in self.memo and name in self.parsed:
            self.memo[name] = FusedBody({}, [])  # a cycle (none in valid HLO) reads in full
            self.memo[name] = self._analyse(self.parsed[name])
        return self.memo.get(name)

    def _use(self, user: Instruction, operand: str) -> int | None:
        """Bytes `user` reads of its operand `operand` when only part of it (None: all of it)."""
        if user.op in SLICES and user.operands[0] == operand:
            return shape_bytes(user.shape)
        if user.op == "dynamic-update-slice" and user.operands[0] == operand:
            return 0  # the buffer updated in place: only the update moves
        called = user.called("calls") if user.op == "fusion" else []
        if called and (nested := self.body(called[0])):
            parts = [nested.reads.get(i) for i, o in enumerate(user.operands) if o == operand]
            return None if not parts or None in parts else sum(parts)  # type: ignore[arg-type]
        return None

    def _analyse(self, instructions: list[Instruction]) -> FusedBody:
        by = {i.name: i for i in instructions}
        users: dict[str, list[Instruction]] = {}
        for ins in instructions:
            for o in dict.fromkeys(ins.operands):
                users.setdefault(o, []).append(ins)

        def uses(name: str) -> list[tuple[Instruction, str]]:
            """(user, the operand's name there) for every user, looking through bitcasts."""
            found = []
            for u in users.get(name, []):
                found += uses(u.name) if u.op == "bitcast" else [(u, name)]
            return found

        reads: dict[int, int | None] = {}
        for ins in instructions:
            if ins.op == "parameter":
                parts = [self._use(u, n) for u, n in uses(ins.name)]
                reads[int(ins.inside.strip() or 0)] = None if not parts or None in parts else sum(parts)
        root = next((i for i in instructions if i.root), None)
        if root is None:
            outputs: list[Instruction | None] = []
        else:
            outputs = [by.get(o) for o in root.operands] if root.op == "tuple" else [root]
        writes: list[int | None] = []
        for out in outputs:
            while out is not None and out.op == "bitcast" and out.operands:
                out = by.get(out.operands[0])
            written = None
            if out is not None and out.op == "dynamic-update-slice" and len(out.operands) > 1:
                update = by.get(out.operands[1])
                written = shape_bytes(update.shape) if update is not None else None
            elif out is not None and out.op == "fusion" and (called := out.called("calls")):
                nested = self.body(called[0])
                written = nested.writes[0] if nested and len(nested.writes) == 1 else None
            writes.append(written)
        return FusedBody(reads, writes)


@dataclass
class HbmTraffic:
    """Bytes a program moves across HBM per chip (every computation as often as it runs), and by opcode."""

    bytes: float = 0.0
    by_op: dict[str, float] = field(default_factory=dict)

    def add(self, op: str, nbytes: float) -> None:
        if nbytes:
            self.bytes += nbytes
            self.by_op[op] = self.by_op.get(op, 0.0) + nbytes


def _charge(ins: Instruction, shapes: dict[str, str], fused: Fusions) -> float:
    op = ins.op
    if op in FREE or op.endswith("-update"):
        return 0.0
    if op.endswith("-done"):
        return _hbm(ins.shape)
    operand_shapes = [shapes.get(o, "") for o in ins.operands]
    if op in ("slice-start", "dynamic-slice-start"):
        parts = tuple_elements(ins.shape)
        piece = shape_bytes(parts[1]) if len(parts) > 1 else 0
        return piece if operand_shapes and _hbm(operand_shapes[0]) else 0
    if op.endswith("-start"):
        return sum(_hbm(s) for s in operand_shapes)
    if op in SLICES:
        read = shape_bytes(ins.shape) if operand_shapes and _hbm(operand_shapes[0]) else 0
        return read + _hbm(ins.shape)
    if op == "dynamic-update-slice":
        update = shape_bytes(operand_shapes[1]) if len(operand_shapes) > 1 else 0
        read = update if len(operand_shapes) > 1 and _hbm(operand_shapes[1]) else 0
        return read + (update if _hbm(ins.shape) else 0)
    if op == "fusion" and (called := ins.called("calls")) and (body := fused.body(called[0])):
        total = 0
        for i, s in enumerate(operand_shapes):
            hbm = _hbm(s)
            if hbm:
                part = body.reads.get(i)
                total += hbm if part is None else min(part, hbm)
        outs = tuple_elements(ins.shape)
        for j, out in enumerate(outs):
            hbm = _hbm(out)
            if hbm:
                part = body.writes[j] if j < len(body.writes) else None
                total += hbm if part is None else min(part, hbm)
        return total
    return sum(_hbm(s) for s in operand_shapes) + _hbm(ins.shape)


def hbm_traffic(hlo: str | HloModule) -> HbmTraffic:
    """The HBM bytes one run of the compiled program `hlo` moves per chip (method: module docstring)."""
    module = as_module(hlo)
    parsed = {name: comp.instructions for name, comp in module.computations.items()}
    scheduled, todo = set(), [module.entry] if module.entry else []
    while todo:
        name = todo.pop()
        if name in scheduled or name not in parsed:
            continue
        scheduled.add(name)
        for ins in parsed[name]:
            if ins.op in ("while", "conditional", "call"):
                todo += ins.called("body", "condition", "to_apply", "true_computation", "false_computation")
            todo += ins.called("branch_computations")
    fused = Fusions(parsed)
    traffic = HbmTraffic()
    for name in scheduled:
        shapes = {ins.name: ins.shape for ins in parsed[name]}
        times = module.times(name)
        for ins in parsed[name]:
            traffic.add(ins.op, times * _charge(ins, shapes, fused))
    return traffic
