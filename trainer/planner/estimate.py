"""How long a compiled program takes on a TPU slice, as a range (low..high), from the compiler's figures.

Pure (no JAX): the planner (trainer/planner/plan.py) and the console price the same per-chip figures the
same way.

    time = max(flops / peak bf16 flop/s, HBM bytes / HBM bandwidth) + the sum over collectives of
           (fixed cost + ring steps x per-hop latency + bytes on the wire / the group's link bandwidth)

The two ends differ in what is uncertain, never in the published figures (trainer/planner/tpu_specs.py):
- HBM bytes. Low: the floor, what must cross HBM once (for a decode step, the chip's weights and its KV
  cache up to the current length; for any other program, its arguments). High: the larger of the bytes
  the compiled program moves across HBM, read from its HLO by memory space (trainer/planner/hbm_traffic.py:
  every HBM operand and result in full, a prefetch once), and the floor times what a real chip was
  measured to take over its floor (MEASURED_OVER_FLOOR below: 2.85x, the trainer's decode loop on an H100).
  The compiler's own `bytes accessed` also counts on-chip copies (a prefetched weight about five times,
  `--part weight-count`); it stands in only where no HLO count was made.
- Latency. Google's "How to Scale Your Model" (jax-ml.github.io/scaling-book/sharding, "A note on ICI
  latency") gives about 1 us a hop over an ICI link whatever the data, and one measurement: a latency-bound
  all-gather over an axis of 4 on TPU v5e (3 hops) took about 8 us where the hops alone make 3 us. The low
  end is the hops alone (no fixed cost); the high end adds the 5 us that measurement had over its hops, a
  fixed cost per phase (an all-reduce has two: reduce-scatter, then all-gather). LOW and HIGH below.
Both ends: compute and HBM traffic overlap; collectives do not (decode's are on the critical path).

Collectives, on the slice's torus, where the compiled program puts each group: its span, the most chips a
group reaches along each torus axis, read from the HLO's replica groups and the chips' coordinates
(trainer/planner/collectives.py torus_span; on v6e-16 a host's 4 chips are a 2x2 square, two hosts a 4x2
block). Where no span was read (a program compiled before spans were, a spelling not read), a group of n chips
is placed on whole axes, the longest first (4x4 -> a group of 4 is one axis, of 16 both). A chip receives over
the links of the axes its group spans, its share of the chip's bidirectional ICI bandwidth (half of it
inbound) by axes used. Bytes on the wire per
chip, by kind, for a result of R bytes (every array of a tuple): all-reduce 2(n-1)/n R (reduce-scatter
then all-gather), all-gather (n-1)/n R, reduce-scatter (n-1) R (R is one chip's piece), all-to-all
(n-1)/n R, collective-permute R. Ring steps, one hop each: (a - 1) per axis of length a (no wraparound
link; an axis that wraps needs about a / 2), twice for an all-reduce; one for a permute.

Across slices (Multislice, trainer/planner/dcn.py finds these in the HLO): each transfer costs a fixed latency
plus the bytes a chip puts on the data-center network at its share of the host's NICs
(trainer/planner/tpu_specs.py DCN_BANDWIDTH, published per generation but v4's). No public DCN latency
exists: LOW and HIGH assume one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainer.planner.dcn import per_token
from trainer.planner.dcn import wire_bytes as dcn_wire_bytes
from trainer.planner.tpu_specs import DCN_BANDWIDTH, TpuSlice


@dataclass(frozen=True)
class End:
    """One end of the range: which HBM count it prices, and the latencies it assumes."""

    name: str
    hbm: str  # "floor" (what must be read once) or "traffic" (what the compiled program moves across HBM)
    fixed_s: float  # a collective's fixed cost per phase (launch, synchronisation)
    hop_s: float  # one ring step between neighbouring chips
    dcn_fixed_s: float = 0.0  # one transfer between slices over the data-center network: assumed
    dcn_bandwidth: str = "fast"  # which of tpu_specs.DcnBandwidth's figures (they differ only where assumed)
    over_floor: float = 1.0  # HBM takes at least this many times the floor's time at the published bandwidth


# ICI latency, from "How to Scale Your Model" (Austin et al., Google DeepMind 2025), part 3, "A note on ICI
# latency" (jax-ml.github.io/scaling-book/sharding): "Each hop over an ICI link has some intrinsic overhead
# regardless of the data volume. This is typically around 1us", the model T = hops x 1 us for a
# latency-bound collective, and one profile: an all-gather of 32 kB shards over an axis of 4 on TPU v5e,
# 3 hops, "roughly 3 * 1us = 3us. In practice, it's closer to 8us." Low end: 1 us a hop, nothing fixed (the
# book's model). High end: 1 us a hop plus the 5 us that profile had over its hops, per phase. Both from
# v5e; no figure for v6e, v5p or v4 is published. No DCN latency is published: a transfer between slices
# goes chip -> host -> NIC -> network -> host -> chip; 10 us (a round trip inside one data center) at the low
# end, 100 us at the high end, both assumed.
#
# HBM, measured: the trainer's compiled decode loop of the Qwen2.5-3B shape on one NVIDIA H100 (no
# collectives; 256-token prompts, 256 new) took 1.51x, 1.65x and 2.39x the time to read its floor at 8, 32
# and 128 rows, with the floor at the bandwidth measured on that chip (2,812 GB/s); with the floor at the
# data sheet's 3.35 TB/s, as this estimate prices every floor, 1.79x, 1.96x and 2.85x
# (benchmarks/results/gpu_check_h100_2026-11-26.jsonl, its `hbm` and `trainer generate` lines). The HLO's
# count of a TPU decode step is 1.0x-1.2x its floor, so the count alone put those measurements above the
# range; the high end takes the worst of them. One GPU, not a TPU: which part of the gap is traffic the count
# misses, compute that grows with the rows, or bandwidth below the data sheet's, it does not tell apart.
MEASURED_OVER_FLOOR = 2.85
LOW = End("low", "floor", fixed_s=0.0, hop_s=1e-6, dcn_fixed_s=10e-6)
HIGH = End("high", "traffic", fixed_s=5e-6, hop_s=1e-6, dcn_fixed_s=100e-6, dcn_bandwidth="slow",
           over_floor=MEASURED_OVER_FLOOR)


@dataclass(frozen=True)
class Range:
    low: float
    high: float

    def __add__(self, other: Range) -> Range:
        return Range(self.low + other.low, self.high + other.high)

    def __mul__(self, factor: float) -> Range:
        return Range(self.low * factor, self.high * factor)

    __rmul__ = __mul__

    def to_json(self) -> list[float]:
        return [self.low, self.high]

    @classmethod
    def from_json(cls, value: Sequence[float] | None) -> Range | None:
        return None if value is None else cls(float(value[0]), float(value[1]))

    def text(self, scale: float = 1.0, digits: int = 2) -> str:
        """`1.20..3.41` (times `scale`, e.g. 1e3 for ms); three significant digits below 0.1."""

        def one(x: float) -> str:
            return f"{x:.{digits}f}" if x == 0 or abs(x) >= 0.1 else f"{x:.3g}"

        return f"{one(self.low * scale)}..{one(self.high * scale)}"


ZERO = Range(0.0, 0.0)


@dataclass(frozen=True)
class ProgramCost:
    """One program's per-chip figures, as the compiler gave them. ops: (kind, result bytes, group size,
    count) of its collectives (trainer/planner/collectives.py `Collectives.grouped`); hbm_traffic: the bytes
    it moves across HBM (trainer/planner/hbm_traffic.py; 0: not counted, `bytes_accessed` stands in)."""

    flops: float
    bytes_accessed: float
    floor_bytes: float
    ops: Sequence[Sequence] = ()
    dcn_ops: Sequence[Sequence] = ()  # (kind, send bytes, recv bytes, slices, count): dcn.grouped
    hbm_traffic: float = 0.0


def group_axes(group: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The torus axes a group of `group` chips spans, the longest axes first (its best placement)."""
    axes, left = [], group
    for length in sorted(shape, reverse=True):
        if left <= 1:
            break
        take = math.gcd(left, length)
        if take > 1:
            axes.append(take)
            left //= take
    if left > 1:  # a group that is no product of axes (never on a slice's own meshes): one ring of its size
        axes.append(left)
    return tuple(axes)


def wire_bytes(kind: str, result_bytes: float, group: int) -> float:
    """Bytes one chip receives for a collective of `kind` whose result on the chip is `result_bytes`."""
    n = max(group, 1)
    if n == 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (n - 1) / n * result_bytes
    if kind == "reduce-scatter":
        return (n - 1) * result_bytes
    if kind == "collective-permute":
        return result_bytes
    return (n - 1) / n * result_bytes  # all-gather, all-to-all


def ring_steps(kind: str, axes: Sequence[int]) -> int:
    if not axes:
        return 0
    if kind == "collective-permute":
        return 1
    steps = sum(a - 1 for a in axes)
    return 2 * steps if kind == "all-reduce" else steps


def collective_seconds(kind: str, result_bytes: float, group: int, tpu: TpuSlice, end: End,
                       span: Sequence[int] = ()) -> float:
    """One collective's seconds at `end`; span: its group's reach along each torus axis
    (collectives.torus_span), () to place it by its size alone (group_axes)."""
    if group <= 1:
        return 0.0  # a group of one chip moves nothing (XLA keeps a few such ops)
    g = tpu.generation
    axes = tuple(a for a in span if a > 1) if span else group_axes(group, tpu.shape)
    used = min(len(axes), len(tpu.shape)) / len(tpu.shape)
    inbound = g.ici_bandwidth / 2 * used  # bidirectional per chip: half of it comes in
    phases = 2 if kind == "all-reduce" else 1  # reduce-scatter, then all-gather
    return (phases * end.fixed_s + ring_steps(kind, axes) * end.hop_s
            + wire_bytes(kind, result_bytes, group) / inbound)


def collectives_seconds(ops: Iterable[Sequence], tpu: TpuSlice, end: End) -> float:
    """ops: rows of (kind, result bytes, group, count[, span]) (collectives.Collectives.grouped)."""
    return sum(collective_seconds(kind, size, group, tpu, end, *span) * count
               for kind, size, group, count, *span in ops)


def dcn_seconds(rows: Iterable[Sequence], tpu: TpuSlice, end: End) -> float:
    """Time a chip spends on transfers between slices: each one's fixed latency plus its bytes on the wire at
    the chip's DCN bandwidth (the fast figure at the low end, the slow one at the high end)."""
    rows = list(rows)
    if not rows:
        return 0.0
    bandwidth = DCN_BANDWIDTH[tpu.generation.name]
    per_s = getattr(bandwidth, end.dcn_bandwidth)
    return sum((end.dcn_fixed_s + dcn_wire_bytes(kind, send, recv, slices) / per_s) * count
               for kind, send, recv, slices, count, *_ in rows if slices > 1)


def dcn_range(rows: Iterable[Sequence], tpu: TpuSlice) -> Range:
    rows = list(rows)
    return Range(dcn_seconds(rows, tpu, LOW), dcn_seconds(rows, tpu, HIGH))


def price(cost: ProgramCost, tpu: TpuSlice) -> Range:
    """The program's time per chip, low..high (method in the module docstring)."""
    g = tpu.generation
    compute = cost.flops / g.peak_bf16_flops
    counted = cost.hbm_traffic or cost.bytes_accessed
    floor = min(cost.floor_bytes, counted) if counted else cost.floor_bytes
    ends = []
    for end in (LOW, HIGH):
        hbm = floor if end.hbm == "floor" else max(counted, floor * end.over_floor)
        ends.append(max(compute, hbm / g.hbm_bandwidth) + collectives_seconds(cost.ops, tpu, end)
                    + dcn_seconds(cost.dcn_ops, tpu, end))
    return Range(*ends)


@dataclass(frozen=True)
class Ranking:
    """Which of several options (rollout layouts) is fastest: `choice` wins at both ends when `certain`;
    otherwise it is the one whose worst case (high end) is smallest, and the ranking is uncertain."""

    choice: str
    certain: bool
    fastest_low: str
    fastest_high: str

    def text(self) -> str:
        if self.certain:
            return f"{self.choice} is the fastest at both ends of the range"
        return (
            f"the ranking is uncertain: {self.fastest_low} is the fastest at the low end, "
            f"{self.fastest_high} at the high end; the smaller worst case is {self.choice}'s"
        )


def rank(ranges: Mapping[str, Range]) -> Ranking:
    fastest_low = min(ranges, key=lambda k: ranges[k].low)
    fastest_high = min(ranges, key=lambda k: ranges[k].high)
    return Ranking(fastest_high, fastest_low == fastest_high, fastest_low, fastest_high)


def mean_cache_fraction(prompt_len: int, max_new: int, steps: float) -> float:
    """The share of the KV cache's slots filled, on average, over a decode loop of `steps` tokens (the floor
    reads the cache up to the current length, not all `prompt + max new` slots)."""
    total = prompt_len + max_new
    return min(1.0, (prompt_len + steps / 2) / total) if total else 1.0


def expected_steps(longest_rows: Sequence[int], max_new: int) -> float:
    """The decode loop's expected length: the mean, over earlier steps, of each step's longest row (the loop
    runs until its last row ends), capped by the config's maximum; the maximum without history."""
    rows = [min(int(n), max_new) for n in longest_rows if n is not None and n >= 0]
    return sum(rows) / len(rows) if rows else float(max_new)


def step_runs(steps: float, logprob_passes: int) -> dict[str, float]:
    """How many times each program runs in one training step (the decode step once a token), as the step
    estimate adds them up."""
    return {"rollout weights": 1, "prefill": 1, "decode step": steps, "update": 1,
            "log-probs": logprob_passes}


def network_step(programs: Mapping[str, tuple[Sequence, Sequence]], tpu: TpuSlice, steps: float,
                 logprob_passes: int, slices: int = 1) -> dict:
    """Bytes one chip puts on the wire in a training step, and their time (low..high), inside a slice (ICI)
    and between slices (DCN). programs: name -> (its collectives, grouped as Collectives.grouped; its
    transfers between slices, grouped as dcn.grouped)."""
    ici_bytes = dcn_bytes = 0.0
    ici, dcn = ZERO, ZERO
    for name, runs in step_runs(steps, logprob_passes).items():
        if name not in programs or not runs:
            continue
        ops, dcn_ops = programs[name]
        ici_bytes += runs * sum(wire_bytes(kind, size, group) * n for kind, size, group, n, *_ in ops)
        ici = ici + Range(collectives_seconds(ops, tpu, LOW), collectives_seconds(ops, tpu, HIGH)) * runs
        dcn_bytes += runs * sum(dcn_wire_bytes(*row[:4]) * row[4] for row in dcn_ops)
        dcn = dcn + dcn_range(dcn_ops, tpu) * runs
    # The decode loop's waits on the other slices every token (the decode step, compiled alone, has none).
    loop = per_token(programs.get("decode loop", ((), ()))[1])
    dcn_bytes += steps * sum(dcn_wire_bytes(*row[:4]) * row[4] for row in loop)
    dcn = dcn + dcn_range(loop, tpu) * steps
    return {
        "slices": slices,
        "decode_steps": steps,
        "ici_bytes_per_chip": ici_bytes,
        "ici_s": ici.to_json(),
        "dcn_bytes_per_chip": dcn_bytes,
        "dcn_bytes_per_host": dcn_bytes * tpu.chips // tpu.hosts,
        "dcn_s": dcn.to_json(),
        "dcn_gbps_per_chip": [DCN_BANDWIDTH[tpu.generation.name].fast * 8 / 1e9,
                              DCN_BANDWIDTH[tpu.generation.name].slow * 8 / 1e9],
        "dcn_bandwidth_assumed": DCN_BANDWIDTH[tpu.generation.name].assumed,
    }


def _gb(n: float) -> str:
    """Bytes in GB, or in MB below 0.1 GB (a tiny model's step)."""
    return f"{n / 1e9:.3f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


def network_lines(plan: Mapping) -> list[str]:
    """The step's traffic inside a slice and between slices in words (from the planner's JSON)."""
    net = plan.get("network_step")
    if not net:
        return []
    ici, dcn = Range.from_json(net["ici_s"]), Range.from_json(net["dcn_s"])
    lines = [
        f"per step and chip, decode at {net['decode_steps']:.0f} tokens: ICI "
        f"{_gb(net['ici_bytes_per_chip'])} on the wire, {ici.text()} s"
    ]
    if net["slices"] > 1:
        low, high = net["dcn_gbps_per_chip"]
        rate = f"{low:.0f}" if low == high else f"{high:.0f}..{low:.0f}"
        lines[0] += (
            f"; DCN across {net['slices']} slices {_gb(net['dcn_bytes_per_chip'])} "
            f"({_gb(net['dcn_bytes_per_host'])} a host), {dcn.text()} s at {rate} Gbps a chip"
            + (" (assumed)" if net["dcn_bandwidth_assumed"] else "")
        )
        crossing = [p for p in plan.get("programs", []) if p.get("dcn_bytes")]
        for p in crossing:
            est = Range.from_json(p.get("dcn_seconds"))
            lines.append(
                f"  {p['name']} ({p['runs']}): {sum(row[4] for row in p['dcn_ops'])} transfers between "
                f"slices, {p['dcn_bytes'] / 1e6:.2f} MB a chip, {est.text(1e3) if est else '-'} ms"
            )
    return lines


def step_lines(plan: Mapping) -> list[str]:
    """The plan's step estimate in words (from the planner's JSON, so the console prints the same lines)."""
    est = {k: Range.from_json(v) for k, v in (plan.get("step_estimate_s") or {}).items()}
    if not est:
        return []
    expected, most = plan.get("expected_new_tokens") or 0, plan.get("new_tokens") or 0
    known = plan.get("longest_rows_known") or 0
    where = (
        f"the mean longest row of {known} earlier steps of this config"
        if known
        else "the config's maximum; no earlier run of this config in the history"
    )
    lines = [
        "estimated step, seconds per chip, low..high: "
        + ", ".join(f"{k} {v.text()}" for k, v in est.items() if v is not None)
        + f" (decode loop at {expected:.0f} tokens: {where})"
    ]
    at_max = Range.from_json((plan.get("step_estimate_at_max_s") or {}).get("step_s"))
    if known and at_max is not None:
        lines.append(f"  at the maximum, {most} tokens: step_s {at_max.text()}")
    lines.append(
        "  low: HBM at the floor (weights and KV cache read once), short collective latencies; high: what "
        f"the compiled program moves across HBM or {MEASURED_OVER_FLOOR}x the floor (as measured on a GPU), "
        "whichever is more, long latencies (trainer/planner/estimate.py)"
    )
    return lines
