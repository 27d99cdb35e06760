"""A compiled program's flops and bytes with each loop counted as often as it runs.

XLA's `cost_analysis()` counts a while loop's body once, whatever its trip count (measured: a scan of 1, 4
and 16 matmuls reports one matmul's flops). The update runs its micro-batches in a loop and, with
`train.scan_layers`, its blocks in two more (forward and backward) inside it, so the compiler's figure is
one micro-batch's one block plus the rest; a scanned rollout's prefill and decode step run their blocks in
one loop each (trainer/scanned.py), so a token's figure would be one block's. Here the compiled HLO is
read for its while loops and their trip counts (trainer/planner/hlo_text.py), and each loop body's cost is
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

from dataclasses import dataclass, field

from trainer.planner.hlo_text import HloModule, Loop, as_module


@dataclass
class WholeCost:
    """A program's flops and bytes with every loop of known trip count counted as often as it runs."""

    flops: float
    bytes_accessed: float
    loops: list[Loop] = field(default_factory=list)

    @property
    def trip_counts(self) -> list[int | None]:
        return [loop.trips for loop in self.loops]


def cpu_cost_analysis(module_text: str) -> tuple[float, float]:
    """XLA's cost analysis (CPU client) of an HLO module's text: (flops, bytes accessed)."""
    import jax
    import jaxlib._hlo as hlo
    from jax._src.lib import xla_client

    module = hlo.hlo_module_from_text(module_text)
    cost = xla_client._xla.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module)
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def whole_cost(hlo: str | HloModule, flops: float, bytes_accessed: float) -> WholeCost:
    """`flops` and `bytes_accessed` (the compiler's cost_analysis() of the program `hlo` is) with every loop
    of known trip count counted as often as it runs. Unchanged when no such loop runs more than once."""
    module = as_module(hlo)
    counted = [loop for loop in module.loops if loop.trips is not None and loop.trips > 1]
    if not counted:
        return WholeCost(flops, bytes_accessed, module.loops)
    assert module.entry is not None, "HLO text without an entry computation"
    try:
        once_flops, once_bytes = cpu_cost_analysis(module.submodule(module.entry))
        extra_flops = extra_bytes = 0.0
        for loop in counted:
            body_flops, body_bytes = cpu_cost_analysis(module.submodule(loop.body))
            factor = (loop.trips - 1) * max(module.runs.get(loop.parent, 1), 1)
            extra_flops += factor * body_flops
            extra_bytes += factor * body_bytes
    except RuntimeError:  # no CPU backend in this process (JAX_PLATFORMS without cpu): the compiler's own
        return WholeCost(flops, bytes_accessed, module.loops)
    scale_flops = (once_flops + extra_flops) / once_flops if once_flops else 1.0
    scale_bytes = (once_bytes + extra_bytes) / once_bytes if once_bytes else 1.0
    return WholeCost(flops * scale_flops, bytes_accessed * scale_bytes, module.loops)
