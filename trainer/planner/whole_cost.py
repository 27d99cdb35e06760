"""A compiled program's flops and bytes with each loop counted as often as it runs.

XLA's `cost_analysis()` counts a while loop's body once, whatever its trip count (measured: a scan of 1, 4
and 16 matmuls reports one matmul's flops). The update runs its micro-batches in a loop and, with
`train.scan_layers`, its blocks in two more (forward and backward) inside it, so the compiler's figure is
one micro-batch's one block plus the rest; a scanned rollout's prefill and decode step run their blocks in
one loop each (trainer/scanned.py), so a token's figure would be one block's. Here the compiled HLO is
read for its while loops and their trip counts (XLA's `known_trip_count` where the compiler wrote one;
otherwise the loop's condition `i < N` with `i` starting from a constant), and each loop body's cost is
XLA's own cost analysis of that body alone (the body made the entry computation of a module holding what
it calls). Then

    whole = counted + sum over loops of (trips - 1) x cost of the body x the trips of the loops around it

in the compiler's own units. The body costs come from the cost analysis of the CPU client (the only
PjRt client on a machine with no TPU; a compile-only TPU client has none) over the TPU compiler's HLO:
its flops are the TPU's to the flop (the same HloCostAnalysis), its bytes differ by the layouts' padding,
so `whole` scales the TPU's figure by the CPU analysis' ratio of whole to counted. A loop whose trip
count cannot be read (the decode loop, which runs until every row has ended) stays counted once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A computation's header: `%name (params) -> shape {` or `ENTRY %name ...`; its body ends at a line `}`.
_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%(?P<name>[\w.\-]+)\s.*\{\s*$")
_WHILE = re.compile(
    r"%(?P<name>[\w.\-]+)\s*=.*?\swhile\((?P<operand>[^)]*)\),\s*condition=%(?P<cond>[\w.\-]+),\s*"
    r"body=%(?P<body>[\w.\-]+)(?P<rest>.*)$"
)
_CALLED = re.compile(
    r"(?:calls|to_apply|body|condition|true_computation|false_computation|called_computations|"
    r"branch_computations|scatter|select)=\{?(?P<names>%[\w.\-]+(?:,\s*%[\w.\-]+)*)\}?"
)
_KNOWN_TRIPS = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(?P<n>\d+)"')
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$")
_CONSTANT = re.compile(r"\sconstant\((?P<value>-?\d+)\)")
_COMPARE = re.compile(r"\scompare\(%(?P<a>[\w.\-]+),\s*%(?P<b>[\w.\-]+)\),\s*direction=(?P<dir>LT|GT)")
_GTE = re.compile(r"\sget-tuple-element\(%(?P<tuple>[\w.\-]+)\),\s*index=(?P<index>\d+)")
_TUPLE = re.compile(r"\stuple\((?P<operands>[^)]*)\)")
_STACK_FRAME = re.compile(r",?\s*stack_frame_id=\d+")
_PASS_THROUGH = re.compile(r"\s(?:copy|bitcast|convert)\(%(?P<operand>[\w.\-]+)\)")


@dataclass
class Loop:
    """One while loop of a compiled program: where it is, its body and condition, and how often it runs
    (None: unknown)."""

    name: str
    parent: str
    body: str
    trips: int | None
    condition: str = ""


@dataclass
class WholeCost:
    """A program's flops and bytes with every loop of known trip count counted as often as it runs."""

    flops: float
    bytes_accessed: float
    loops: list[Loop] = field(default_factory=list)

    @property
    def trip_counts(self) -> list[int | None]:
        return [loop.trips for loop in self.loops]


def computation_header(line: str) -> str | None:
    """The computation a line of HLO text begins, or None."""
    m = _HEADER.match(line)
    return m.group("name") if m else None


def computations(hlo_text: str) -> tuple[dict[str, list[str]], str | None]:
    """Each computation's lines (header first) by name, and the entry computation's name."""
    comps: dict[str, list[str]] = {}
    entry = None
    current: list[str] | None = None
    for line in hlo_text.splitlines():
        if current is None:
            m = _HEADER.match(line)
            if m:
                current = comps.setdefault(m.group("name"), [])
                current.append(line)
                if m.group("entry"):
                    entry = m.group("name")
            continue
        current.append(line)
        if line.rstrip() == "}":
            current = None
    return comps, entry


def _instructions(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines[1:]:
        m = _INSTRUCTION.match(line)
        if m:
            out[m.group("name")] = m.group("rest")
    return out


def _constant(instructions: dict[str, str], name: str) -> int | None:
    """The integer constant `name` holds, through copies, bitcasts and converts (None: not a constant)."""
    for _ in range(8):
        text = instructions.get(name, "")
        if m := _CONSTANT.search(text):
            return int(m.group("value"))
        m = _PASS_THROUGH.search(text)
        if not m:
            return None
        name = m.group("operand")
    return None


def _trip_count(comps: dict[str, list[str]], parent: str, operand: str, cond: str, rest: str) -> int | None:
    """The loop's trip count: XLA's known_trip_count, else `i < N` (or `N > i`) in its condition with i a
    tuple element whose initial value is a constant (the counter of a scan or fori_loop)."""
    if m := _KNOWN_TRIPS.search(rest):
        return int(m.group("n"))
    cond_ins = _instructions(comps.get(cond, []))
    root = next((line for line in comps.get(cond, []) if line.lstrip().startswith("ROOT")), "")
    m = _COMPARE.search(root)
    if not m:
        return None
    a, b = m.group("a"), m.group("b")
    if m.group("dir") == "GT":
        a, b = b, a
    bound = _constant(cond_ins, b)
    counter = _GTE.search(cond_ins.get(a, ""))
    if bound is None or not counter:
        return None
    parent_ins = _instructions(comps.get(parent, []))
    init = _TUPLE.search(parent_ins.get(operand.strip().lstrip("%"), ""))
    if not init:
        return None
    operands = [x.strip().lstrip("%") for x in init.group("operands").split(",")]
    index = int(counter.group("index"))
    if index >= len(operands):
        return None
    start = _constant(parent_ins, operands[index])
    if start is None:
        return None
    return max(bound - start, 0)


def loops(hlo_text: str) -> tuple[list[Loop], dict[str, list[str]]]:
    """Every while loop of the module with its trip count (None where it cannot be read)."""
    comps, _ = computations(hlo_text)
    found = []
    for parent, lines in comps.items():
        for line in lines[1:]:
            m = _WHILE.search(line)
            if m:
                trips = _trip_count(comps, parent, m.group("operand"), m.group("cond"), m.group("rest"))
                found.append(Loop(m.group("name"), parent, m.group("body"), trips, m.group("cond")))
    return found, comps


def _callees(lines: list[str]) -> set[str]:
    out: set[str] = set()
    for line in lines[1:]:
        for m in _CALLED.finditer(line):
            out.update(n.strip().lstrip("%") for n in m.group("names").split(","))
    return out


def _module_of(comps: dict[str, list[str]], entry: str) -> str:
    """HLO text of a module whose entry is `entry`, holding what it calls (in the original order)."""
    keep, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in keep or name not in comps:
            continue
        keep.add(name)
        todo.extend(_callees(comps[name]))
    parts = ["HloModule loop_body"]
    for name, lines in comps.items():
        if name not in keep:
            continue
        header = re.sub(r"^ENTRY\s+", "", lines[0])
        if name == entry:
            header = "ENTRY " + header
        # Source locations name the module's stack-frame table, which this module leaves out.
        parts.append(_STACK_FRAME.sub("", "\n".join([header, *lines[1:]])))
    return "\n\n".join(parts) + "\n"


def cpu_cost_analysis(module_text: str) -> tuple[float, float]:
    """XLA's cost analysis (CPU client) of an HLO module's text: (flops, bytes accessed)."""
    import jax
    import jaxlib._hlo as hlo
    from jax._src.lib import xla_client

    module = hlo.hlo_module_from_text(module_text)
    cost = xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def computation_runs(hlo_text: str) -> dict[str, int]:
    """How often one run of the program runs each computation's code: a loop body's trip count (1 where it
    is unknown) times what runs the loop. XLA prints callees before callers, so walking the text backwards
    reaches every caller before what it calls."""
    found, comps = loops(hlo_text)
    _, entry = computations(hlo_text)
    trips = {loop.body: loop.trips or 1 for loop in found}
    runs = {entry: 1} if entry else {}
    for name in reversed(list(comps)):
        n = runs.get(name, 0)
        for callee in _callees(comps[name]) if n else ():
            runs[callee] = runs.get(callee, 0) + n * trips.get(callee, 1)
    return runs


def whole_cost(hlo_text: str, flops: float, bytes_accessed: float) -> WholeCost:
    """`flops` and `bytes_accessed` (the compiler's cost_analysis() of the program `hlo_text` is) with every
    loop of known trip count counted as often as it runs. Unchanged when no such loop runs more than once."""
    found, comps = loops(hlo_text)
    counted = [loop for loop in found if loop.trips is not None and loop.trips > 1]
    if not counted:
        return WholeCost(flops, bytes_accessed, found)
    runs = computation_runs(hlo_text)
    _, entry = computations(hlo_text)
    assert entry is not None, "HLO text without an entry computation"
    try:
        once_flops, once_bytes = cpu_cost_analysis(_module_of(comps, entry))
        extra_flops = extra_bytes = 0.0
        for loop in counted:
            body_flops, body_bytes = cpu_cost_analysis(_module_of(comps, loop.body))
            factor = (loop.trips - 1) * max(runs.get(loop.parent, 1), 1)
            extra_flops += factor * body_flops
            extra_bytes += factor * body_bytes
    except RuntimeError:  # no CPU backend in this process (JAX_PLATFORMS without cpu): the compiler's own
        return WholeCost(flops, bytes_accessed, found)
    scale_flops = (once_flops + extra_flops) / once_flops if once_flops else 1.0
    scale_bytes = (once_bytes + extra_bytes) / once_bytes if once_bytes else 1.0
    return WholeCost(flops * scale_flops, bytes_accessed * scale_bytes, found)
