"""A compiled program's HLO text (`compiled.as_text()`), parsed once for the planner's readers.

Every reading of HLO the planner makes goes through here: the cost of each loop (whole_cost.py), the bytes
that cross HBM (hbm_traffic.py), the collectives inside a slice (collectives.py) and the transfers between
slices (dcn.py). Pure text processing, no JAX. What is read:

- computations: `%name (params) -> shape {` (`ENTRY %name ...` for the entry) up to a line `}`; lines
  outside any computation (a test's one-line program) are kept as `HloModule.loose`;
- instructions: `[ROOT] %name = SHAPE opcode(operands), attributes`; a shape is an array
  `bf16[2048,2752]{0,1:T(8,128)(2,1)S(1)}` (dtype, dimensions, layout; `S(n)` its memory space, none or
  S(0) HBM) or a tuple of them;
- the computations an instruction calls (`calls=`, `body=`, `condition=`, `to_apply=`, branches...);
- while loops and their trip counts: XLA's `known_trip_count` where the compiler wrote one, else the
  condition's `i < N` with `i` a tuple element whose initial value is a constant (a scan's or fori_loop's
  counter); None where neither is there (the decode loop runs until every row has ended);
- how often one run of the program runs each computation (a loop body by its trip count, times what runs
  the loop);
- a collective's replica groups in XLA's spellings (explicit `{{0,1},{2,3}}`, iota `[2,4]<=[4,2]T(1,0)`,
  named mesh axes `mesh['axis_0'=4] {'axis_0'}`, a permute's `source_target_pairs`) and an instruction's
  frontend attributes (`_xla_megascale_target=...`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

_NAME = r"[\w.\-]+"
# A computation's header: `%name (params) -> shape {` or `ENTRY %name ...`; its body ends at a line `}`.
_HEADER = re.compile(rf"^(?P<entry>ENTRY\s+)?%(?P<name>{_NAME})\s.*\{{\s*$")
# `%name = SHAPE opcode(`: the shape may be a tuple with spaces, never ` word(`.
_INSTRUCTION = re.compile(
    rf"^\s*(?P<root>ROOT\s+)?%?(?P<name>{_NAME})\s*=\s*(?P<shape>.*?)\s(?P<op>[a-z][\w\-]*)\("
)
_OPERAND = re.compile(rf"%(?P<name>{_NAME})")
_ARRAY = re.compile(
    r"(?P<dtype>pred|s4|u4|s8|u8|s16|u16|f16|bf16|s32|u32|f32|s64|u64|f64|f8e\w+|c64|c128)"
    r"\[(?P<dims>[\d,]*)\](?:\{(?P<layout>[^}]*)\})?"
)
_SPACE = re.compile(r"S\((?P<space>\d+)\)")
# Attributes naming the computations an instruction runs: one (`body=%b`) or a list (`branch_computations=
# {%a, %b}`). A fusion's `calls` is analysed with the fusion; the rest run on the program's schedule.
CALLING_ATTRIBUTES = ("calls", "to_apply", "body", "condition", "true_computation", "false_computation",
                      "called_computations", "branch_computations", "scatter", "select")
_CALLED = re.compile(
    rf"(?P<key>{'|'.join(CALLING_ATTRIBUTES)})=\{{?(?P<names>%{_NAME}(?:,\s*%{_NAME})*)\}}?"
)
_ATTRIBUTE = re.compile(r"(?<![\w\-])(?P<key>[a-z_]+)=(?P<value>[\w\-]+)")
_KNOWN_TRIPS = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(?P<n>\d+)"')
_STACK_FRAME = re.compile(r",?\s*stack_frame_id=\d+")
_FRONTEND = re.compile(r'(?P<key>_xla_[a-z_]+)=(?P<value>"[^"]*"|\{\{[\d,{} ]*\}\})')
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{(?P<body>(?:\{[\d,]*\},?)*)\}")
_IOTA_GROUPS = re.compile(
    r"replica_groups=\[(?P<shape>[\d,]+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?"
)
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\](?P<rest>.*)")
_MESH_AXIS = re.compile(r"'(?P<name>[^']+)'=(?P<size>\d+)")
_MESH_NAMES = re.compile(r"\{(?P<names>'[^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{(?P<body>(?:\{\d+,\d+\},?)*)\}")
_BRACED = re.compile(r"\{(?P<items>[\d,\s]*)\}")
_SLICES_BY_RANGE = re.compile(r"^\{(?P<slices>[\d,]+)\}x")
_ENTRY = re.compile(r"^ENTRY\s+")
_DIGITS = re.compile(r"\d+")

_BITS = {"pred": 8, "s4": 4, "u4": 4, "c64": 64, "c128": 128}


# ---- shapes --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Array:
    """One array of a shape: its dtype, dimensions, bytes and memory space (0: HBM)."""

    nbytes: int
    space: int
    dtype: str = ""
    dims: tuple[int, ...] = ()


def _bits(dtype: str) -> int:
    if dtype in _BITS:
        return _BITS[dtype]
    digits = _DIGITS.search(dtype)
    return int(digits.group()) if digits else 8


def arrays(shape: str) -> list[Array]:
    """Every array of an HLO shape (a tuple's, in order) with its bytes and memory space."""
    found = []
    for m in _ARRAY.finditer(shape):
        dims = tuple(int(d) for d in m.group("dims").split(",") if d)
        space = _SPACE.search(m.group("layout") or "")
        found.append(Array((math.prod(dims) * _bits(m.group("dtype")) + 7) // 8,
                           int(space.group("space")) if space else 0, m.group("dtype"), dims))
    return found


def shape_bytes(shape: str) -> int:
    """Bytes of every array of a shape, wherever it lives."""
    return sum(a.nbytes for a in arrays(shape))


def tuple_elements(shape: str) -> list[str]:
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


# ---- instructions and computations ---------------------------------------------------------------------


@dataclass
class Instruction:
    """One instruction: its result's shape, opcode, operand names, the text after its operands (attributes)
    and between its parentheses (a parameter's number, a constant's value)."""

    name: str
    shape: str
    op: str
    operands: list[str]
    attrs: str
    root: bool
    inside: str = ""

    def attribute(self, key: str) -> str | None:
        """A plain attribute's value (`direction=LT` -> "LT", `index=1` -> "1"), None when absent."""
        for m in _ATTRIBUTE.finditer(self.attrs):
            if m.group("key") == key:
                return m.group("value")
        return None

    def called(self, *keys: str) -> list[str]:
        """The computations this instruction names in the attributes `keys` (all calling attributes when
        none are given), in the order written."""
        wanted = keys or CALLING_ATTRIBUTES
        return [n.strip().lstrip("%") for m in _CALLED.finditer(self.attrs) if m.group("key") in wanted
                for n in m.group("names").split(",")]

    def integer(self) -> int | None:
        """The value of an integer constant, None for anything else."""
        if self.op != "constant":
            return None
        try:
            return int(self.inside.strip())
        except ValueError:
            return None


def _parenthesised(line: str, start: int) -> tuple[str, str]:
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


def parse_instruction(line: str) -> Instruction | None:
    """One line of HLO as an instruction, None for anything else (a header, a brace, a blank)."""
    m = _INSTRUCTION.match(line)
    if not m:
        return None
    inside, attrs = _parenthesised(line, m.end() - 1)
    operands = [o.group("name") for o in _OPERAND.finditer(inside)]
    if not operands and "%" not in line and m.group("op") not in ("constant", "parameter", "iota"):
        operands = [part.split()[-1] for part in inside.split(",") if part.strip()]  # names printed bare
    return Instruction(m.group("name"), m.group("shape"), m.group("op"), operands, attrs,
                       bool(m.group("root")), inside)


@dataclass
class Computation:
    name: str
    lines: list[str]  # as written, the header first
    instructions: list[Instruction]
    entry: bool = False

    @cached_property
    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}

    @property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions if i.root), None)


@dataclass
class Loop:
    """One while loop: the computation it is in, its body and condition, and how often it runs (None:
    unknown)."""

    name: str
    parent: str
    body: str
    trips: int | None
    condition: str = ""


@dataclass
class HloModule:
    """A program's computations by name in the order written (XLA prints callees before callers), its entry,
    and the instructions written outside any computation."""

    computations: dict[str, Computation]
    entry: str | None
    loose: list[Instruction] = field(default_factory=list)

    @cached_property
    def loops(self) -> list[Loop]:
        """Every while loop with its trip count (None where it cannot be read)."""
        found = []
        for comp in self.computations.values():
            for ins in comp.instructions:
                if ins.op == "while" and (body := ins.called("body")):
                    condition = "".join(ins.called("condition")[:1])
                    found.append(Loop(ins.name, comp.name, body[0], self._trip_count(comp, ins), condition))
        return found

    @cached_property
    def runs(self) -> dict[str, int]:
        """How often one run of the program runs each computation's code: a loop body's trip count (1 where
        it is unknown) times what runs the loop. Walking the text backwards reaches every caller before what
        it calls."""
        trips = {loop.body: loop.trips or 1 for loop in self.loops}
        runs = {self.entry: 1} if self.entry else {}
        for name in reversed(list(self.computations)):
            n = runs.get(name, 0)
            if not n:
                continue
            for ins in self.computations[name].instructions:
                for callee in ins.called():
                    runs[callee] = runs.get(callee, 0) + n * trips.get(callee, 1)
        return runs

    def instructions(self) -> list[tuple[str, Instruction]]:
        """(computation, instruction) for every instruction in the order written; "" for loose ones."""
        return [("", i) for i in self.loose] + [
            (c.name, i) for c in self.computations.values() for i in c.instructions
        ]

    def times(self, computation: str) -> int:
        """How often one run of the program runs `computation` (at least once)."""
        return max(self.runs.get(computation, 1), 1)

    def submodule(self, entry: str) -> str:
        """HLO text of a module whose entry is `entry`, holding what it calls (in the original order)."""
        keep, todo = set(), [entry]
        while todo:
            name = todo.pop()
            if name in keep or name not in self.computations:
                continue
            keep.add(name)
            todo.extend(c for i in self.computations[name].instructions for c in i.called())
        parts = ["HloModule loop_body"]
        for name, comp in self.computations.items():
            if name not in keep:
                continue
            header = _ENTRY.sub("", comp.lines[0])
            if name == entry:
                header = "ENTRY " + header
            # Source locations name the module's stack-frame table, which this module leaves out.
            parts.append(_STACK_FRAME.sub("", "\n".join([header, *comp.lines[1:]])))
        return "\n\n".join(parts) + "\n"

    def _constant(self, comp: Computation, name: str) -> int | None:
        """The integer constant `name` holds, through copies, bitcasts and converts (None: not a constant)."""
        for _ in range(8):
            ins = comp.by_name.get(name)
            if ins is None:
                return None
            if ins.op == "constant":
                return ins.integer()
            if ins.op not in ("copy", "bitcast", "convert") or not ins.operands:
                return None
            name = ins.operands[0]
        return None

    def _trip_count(self, parent: Computation, loop: Instruction) -> int | None:
        if m := _KNOWN_TRIPS.search(loop.attrs):
            return int(m.group("n"))
        cond = self.computations.get((loop.called("condition") or [""])[0])
        compare = cond.root if cond else None
        if compare is None or compare.op != "compare" or len(compare.operands) != 2:
            return None
        direction = compare.attribute("direction")
        if direction not in ("LT", "GT"):
            return None
        counter, bound_name = compare.operands if direction == "LT" else reversed(compare.operands)
        bound = self._constant(cond, bound_name)
        element = cond.by_name.get(counter)
        is_element = element is not None and element.op == "get-tuple-element"
        index = element.attribute("index") if is_element else None
        init = parent.by_name.get(loop.operands[0]) if loop.operands else None
        if bound is None or index is None or init is None or init.op != "tuple":
            return None
        if int(index) >= len(init.operands):
            return None
        start = self._constant(parent, init.operands[int(index)])
        return None if start is None else max(bound - start, 0)


def parse_hlo(text: str) -> HloModule:
    """The module's computations and instructions (see the module docstring)."""
    computations: dict[str, Computation] = {}
    entry, current, loose = None, None, []
    for line in text.splitlines():
        if current is None:
            if m := _HEADER.match(line):
                current = Computation(m.group("name"), [line], [], bool(m.group("entry")))
                computations.setdefault(current.name, current)
                entry = current.name if current.entry else entry
            elif ins := parse_instruction(line):
                loose.append(ins)
            continue
        current.lines.append(line)
        if line.rstrip() == "}":
            current = None
        elif ins := parse_instruction(line):
            current.instructions.append(ins)
    return HloModule(computations, entry, loose)


def as_module(hlo: str | HloModule) -> HloModule:
    return parse_hlo(hlo) if isinstance(hlo, str) else hlo


# ---- collectives' groups and frontend attributes -------------------------------------------------------


def replica_groups(attrs: str) -> list[list[int]] | None:
    """A collective's groups of logical device ids, from the explicit (`{{0,1},{2,3}}`) or iota
    (`[2,4]<=[4,2]T(1,0)`) spelling; pairs for a collective-permute; None when empty (every device) or in a
    spelling not read here (named mesh axes)."""
    if m := _PAIRS.search(attrs):
        return [[int(x) for x in g.group("items").split(",")] for g in _BRACED.finditer(m.group("body"))]
    if m := _EXPLICIT_GROUPS.search(attrs):
        groups = [_ids(g.group("items")) for g in _BRACED.finditer(m.group("body"))]
        return [g for g in groups if g] or None
    if m := _IOTA_GROUPS.search(attrs):
        shape = [int(x) for x in m.group("shape").split(",")]
        dims = [int(x) for x in m.group("dims").split(",")]
        perm = [int(x) for x in m.group("perm").split(",")] if m.group("perm") else list(range(len(dims)))
        ids = _iota(dims, perm)
        return [ids[i:i + shape[-1]] for i in range(0, len(ids), shape[-1])]
    return None


def _ids(items: str) -> list[int]:
    """`0,1, 2` -> [0, 1, 2]."""
    return [int(x) for x in items.split(",") if x.strip()]


def _iota(dims: Sequence[int], perm: Sequence[int]) -> list[int]:
    """range(prod(dims)) reshaped to `dims`, transposed by `perm`, flattened (XLA's iota replica groups)."""
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    shape = [dims[p] for p in perm]
    out = []
    for flat in range(math.prod(dims)):
        index, rest = [], flat
        for d in reversed(shape):
            index.append(rest % d)
            rest //= d
        index.reverse()
        out.append(sum(index[axis] * strides[perm[axis]] for axis in range(len(perm))))
    return out


def replica_group_size(attrs: str) -> int | None:
    """How many chips one group of a collective holds (2 for a collective-permute, a transfer between a
    pair); None where the groups are empty (every device) or not written."""
    if "source_target_pairs=" in attrs:
        return 2
    if m := _EXPLICIT_GROUPS.search(attrs):
        first = _BRACED.search(m.group("body"))
        return (len([x for x in first.group("items").split(",") if x.strip()]) or None) if first else None
    if m := _IOTA_GROUPS.search(attrs):
        return int(m.group("shape").split(",")[-1])
    if m := _MESH_GROUPS.search(attrs):
        sizes = {a.group("name"): int(a.group("size")) for a in _MESH_AXIS.finditer(m.group("axes"))}
        names = _MESH_NAMES.search(m.group("rest"))
        chosen = [n.strip().strip("'") for n in names.group("names").split(",")] if names else list(sizes)
        return math.prod(sizes.get(n, 1) for n in chosen)
    return None


def names_mesh_axes(attrs: str) -> bool:
    """Whether the groups are written as named mesh axes (their chips are not listed)."""
    return _MESH_GROUPS.search(attrs) is not None


def frontend_attributes(attrs: str) -> dict[str, str]:
    """The `_xla_...` frontend attributes of an instruction, quotes removed."""
    return {a.group("key"): a.group("value").strip('"') for a in _FRONTEND.finditer(attrs)}


def target_ids(target: str) -> list[int]:
    """The device ids of a megascale target written as a list of groups (`{{100000,100001},{...}}`)."""
    return [i for g in _BRACED.finditer(target) for i in _ids(g.group("items"))]


def target_slice_list(target: str) -> list[int] | None:
    """The slices of a megascale target written `{1,2}x{0:15}` (each chip with the same chip of every listed
    slice), None for another spelling."""
    m = _SLICES_BY_RANGE.match(target)
    return [int(s) for s in m.group("slices").split(",") if s] if m else None
