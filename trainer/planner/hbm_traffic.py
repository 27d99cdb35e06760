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

Each computation is charged as often as it runs (trainer/planner/whole_cost.py: a loop body by its trip count;
a loop of unknown length, the decode loop, once). Pure text processing: no JAX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainer.planner.whole_cost import computation_runs, computations

# `%name = SHAPE opcode(` ; the shape may be a tuple with spaces, never ` word(`.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s(?P<op>[a-z][\w\-]*)\(")
_ARRAY = re.compile(
    r"(?P<dtype>pred|s4|u4|s8|u8|s16|u16|f16|bf16|s32|u32|f32|s64|u64|f64|f8e\w+|c64|c128)"
    r"\[(?P<dims>[\d,]*)\](?:\{(?P<layout>[^}]*)\})?"
)
_BITS = {"pred": 8, "s4": 4, "u4": 4, "c64": 64, "c128": 128}
_SPACE = re.compile(r"S\((?P<space>\d+)\)")
_OPERAND = re.compile(r"%(?P<name>[\w.\-]+)")
_CALLS = re.compile(r"\bcalls=%(?P<name>[\w.\-]+)")
# Computations an instruction runs as part of the program's schedule (a fusion's is analysed with it).
_SCHEDULED = re.compile(
    r"\b(?:body|condition|to_apply|true_computation|false_computation)=%(?P<one>[\w.\-]+)"
    r"|\bbranch_computations=\{(?P<many>[^}]*)\}"
)
FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
    "after-all", "partition-id", "replica-id", "opt-barrier", "add-dependency", "domain",
}
SLICES = {"slice", "dynamic-slice"}


def _itemsize_bits(dtype: str) -> int:
    if dtype in _BITS:
        return _BITS[dtype]
    return int(re.search(r"\d+", dtype).group()) if re.search(r"\d+", dtype) else 8


@dataclass(frozen=True)
class Array:
    nbytes: int
    space: int  # 0: HBM


def arrays(shape: str) -> list[Array]:
    """Every array of an HLO shape (a tuple's, in order) with its bytes and memory space."""
    found = []
    for m in _ARRAY.finditer(shape):
        count = 1
        for d in filter(None, m.group("dims").split(",")):
            count *= int(d)
        space = _SPACE.search(m.group("layout") or "")
        found.append(Array((count * _itemsize_bits(m.group("dtype")) + 7) // 8, int(space.group("space"))
                           if space else 0))
    return found


def _hbm(shape: str) -> int:
    return sum(a.nbytes for a in arrays(shape) if a.space == 0)


def _top_level_tuple(shape: str) -> list[str]:
    """The elements of a tuple shape `(a, (b, c), d)` at its top level; [shape] for an array."""
    s = shape.strip()
    if not s.startswith("("):
        return [s]
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(s):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                parts.append(s[start:i])
        elif ch == "," and depth == 1:
            parts.append(s[start:i])
            start = i + 1
    return [p.strip() for p in parts if p.strip()]


@dataclass
class Instruction:
    name: str
    shape: str
    op: str
    operands: list[str]
    attrs: str
    root: bool
    inside: str = ""  # the text between the parentheses (a parameter's number)


def _operand_text(line: str, start: int) -> tuple[str, str]:
    """The text inside the parentheses opened at `start` (matching nested ones), and what follows."""
    depth = 0
    for i in range(start, len(line)):
        if line[i] == "(":
            depth += 1
        elif line[i] == ")":
            depth -= 1
            if depth == 0:
                return line[start + 1:i], line[i + 1:]
    return line[start + 1:], ""


def parse(lines: list[str]) -> list[Instruction]:
    """A computation's instructions (its header line first in `lines`)."""
    out = []
    for line in lines[1:]:
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        inside, attrs = _operand_text(line, m.end() - 1)
        out.append(Instruction(m.group("name"), m.group("shape"), m.group("op"),
                               [o.group("name") for o in _OPERAND.finditer(inside)], attrs,
                               line.lstrip().startswith("ROOT"), inside))
    return out


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
            return _total(user.shape)
        if user.op == "dynamic-update-slice" and user.operands[0] == operand:
            return 0  # the buffer updated in place: only the update moves
        m = _CALLS.search(user.attrs) if user.op == "fusion" else None
        if m and (nested := self.body(m.group("name"))):
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
                written = _total(update.shape) if update is not None else None
            elif out is not None and out.op == "fusion" and (m := _CALLS.search(out.attrs)):
                nested = self.body(m.group("name"))
                written = nested.writes[0] if nested and len(nested.writes) == 1 else None
            writes.append(written)
        return FusedBody(reads, writes)


def _total(shape: str) -> int:
    return sum(a.nbytes for a in arrays(shape))


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
        parts = _top_level_tuple(ins.shape)
        piece = _total(parts[1]) if len(parts) > 1 else 0
        return piece if operand_shapes and _hbm(operand_shapes[0]) else 0
    if op.endswith("-start"):
        return sum(_hbm(s) for s in operand_shapes)
    if op in SLICES:
        read = _total(ins.shape) if operand_shapes and _hbm(operand_shapes[0]) else 0
        return read + _hbm(ins.shape)
    if op == "dynamic-update-slice":
        update = _total(operand_shapes[1]) if len(operand_shapes) > 1 else 0
        read = update if len(operand_shapes) > 1 and _hbm(operand_shapes[1]) else 0
        return read + (update if _hbm(ins.shape) else 0)
    if op == "fusion" and (m := _CALLS.search(ins.attrs)) and (body := fused.body(m.group("name"))):
        total = 0
        for i, s in enumerate(operand_shapes):
            hbm = _hbm(s)
            if hbm:
                part = body.reads.get(i)
                total += hbm if part is None else min(part, hbm)
        outs = _top_level_tuple(ins.shape)
        for j, out in enumerate(outs):
            hbm = _hbm(out)
            if hbm:
                part = body.writes[j] if j < len(body.writes) else None
                total += hbm if part is None else min(part, hbm)
        return total
    return sum(_hbm(s) for s in operand_shapes) + _hbm(ins.shape)


def hbm_traffic(hlo_text: str) -> HbmTraffic:
    """The HBM bytes one run of the compiled program `hlo_text` moves per chip (method: module docstring)."""
    comps, entry = computations(hlo_text)
    parsed = {name: parse(lines) for name, lines in comps.items()}
    runs = computation_runs(hlo_text)
    scheduled, todo = set(), [entry] if entry else []
    while todo:
        name = todo.pop()
        if name in scheduled or name not in parsed:
            continue
        scheduled.add(name)
        for ins in parsed[name]:
            for m in _SCHEDULED.finditer(ins.attrs):
                if m.group("one"):
                    if ins.op in ("while", "conditional", "call"):
                        todo.append(m.group("one"))
                else:
                    todo += [n.strip().lstrip("%") for n in m.group("many").split(",")]
    fused = Fusions(parsed)
    traffic = HbmTraffic()
    for name in scheduled:
        shapes = {ins.name: ins.shape for ins in parsed[name]}
        times = max(runs.get(name, 1), 1)
        for ins in parsed[name]:
            traffic.add(ins.op, times * _charge(ins, shapes, fused))
    return traffic
