"""Cloud TPU slices as libtpu's ahead-of-time compiler names them, and each generation's published
per-chip figures.

Pure (no JAX): the console maps a node's accelerator type (`v6e-16`, `v4-16`) to a slice with it, and the
planner (trainer/planner/plan.py) asks libtpu for that slice's devices. The figures are Google's published
per-chip numbers (docs.cloud.google.com/tpu/docs/<generation>); the HBM a program may use is not taken from
here but from the compiler itself (trainer/planner/tpu_compile.py `hbm_limit_bytes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Generation:
    name: str  # the accelerator-type prefix: v4, v5p, v5litepod, v6e
    libtpu_name: str  # the prefix of libtpu's topology name (v5litepod is "v5e" there)
    chip_config: str  # libtpu's chip config: v4/v5p run their two TensorCores as one device (megacore)
    cores_per_chip_in_type: int  # v4-16 counts TensorCores (8 chips); v6e-16 counts chips
    torus_dims: int  # 2 (v5e, v6e) or 3 (v4, v5p)
    chips_per_host: int  # on multi-host slices
    largest_single_host: int  # chips of the largest slice that is one VM
    peak_bf16_flops: float  # per chip, flop/s
    hbm_bytes: float  # per chip, as published (the compiler's usable limit is a little lower)
    hbm_bandwidth: float  # per chip, bytes/s
    ici_bandwidth: float  # per chip, bidirectional bytes/s over all its ICI links (in + out, every port)
    ici_ports: int  # ICI links per chip: two per torus axis (one each way round the ring)


GENERATIONS: dict[str, Generation] = {
    # v4: 275 TFLOPs, 32 GiB at 1200 GBps (docs.cloud.google.com/tpu/docs/v4). Cloud's page gives no ICI
    # figure per chip; the TPU v4 paper (Jouppi et al., ISCA 2023) gives six ICI links of 50 GB/s each way:
    # 600 GB/s bidirectional, the field's definition (issue 26: this was 300, a one-way figure).
    "v4": Generation("v4", "v4", "megacore", 2, 3, 4, 4, 275e12, 32 * 1024**3, 1200 * GB, 600 * GB, 6),
    # v5p: 459 TFLOPs, 95 GB at 2765 GBps, "bidirectional ICI bandwidth per chip 1200 GBps", 3D torus
    # (docs.cloud.google.com/tpu/docs/v5p; this was 600, the 4800 Gbps one-way figure).
    "v5p": Generation("v5p", "v5p", "megacore", 2, 3, 4, 4, 459e12, 95 * GB, 2765 * GB, 1200 * GB, 6),
    # v5e: 197 TFLOPs, 16 GB at 819 GBps, "bidirectional ICI bandwidth per chip 400 GBps", 4 ICI ports
    # (docs.cloud.google.com/tpu/docs/v5e).
    "v5litepod": Generation(
        "v5litepod", "v5e", "default", 1, 2, 4, 8, 197e12, 16 * GB, 819 * GB, 400 * GB, 4
    ),
    # v6e (Trillium): 918 TFLOPs, 32 GB at 1638 GBps, "bidirectional ICI bandwidth per chip 800 GBps", 4 ICI
    # ports (docs.cloud.google.com/tpu/docs/v6e).
    "v6e": Generation("v6e", "v6e", "default", 1, 2, 4, 8, 918e12, 32 * GB, 1638 * GB, 800 * GB, 4),
}
ALIASES = {"v5e": "v5litepod"}

Gbps = 1e9 / 8  # bytes/s


@dataclass(frozen=True)
class DcnBandwidth:
    """What one chip sends (and, at the same time, receives) over the data-center network between slices
    (Multislice), bytes/s: `fast` at the estimate's low end, `slow` at its high end. Published figures are the
    NICs' line rate shared by a host's chips, the same at both ends; `assumed` where Google publishes none."""

    fast: float
    slow: float
    assumed: bool = False


DCN_BANDWIDTH: dict[str, DcnBandwidth] = {
    # v6e: "Per-host NIC configuration 4 x 200 Gbps NIC", 8 chips a host: 100 Gbps a chip; "Data center
    # network bandwidth per Pod 25.6 Tbps" over 256 chips agrees (docs.cloud.google.com/tpu/docs/v6e).
    "v6e": DcnBandwidth(100 * Gbps, 100 * Gbps),
    # v5e: "Per-host NIC configuration 2 x 100 Gbps NIC", 8 chips a host: 25 Gbps a chip; 6.4 Tbps per Pod of
    # 256 chips agrees (docs.cloud.google.com/tpu/docs/v5e).
    "v5litepod": DcnBandwidth(25 * Gbps, 25 * Gbps),
    # v5p: "Data center network (DCN) bandwidth per chip (Gbps) 50" (docs.cloud.google.com/tpu/docs/v5p).
    "v5p": DcnBandwidth(50 * Gbps, 50 * Gbps),
    # v4: assumed. Google's v4 page gives no DCN figure; the range spans v5e's and v5p's per-chip figures.
    "v4": DcnBandwidth(50 * Gbps, 25 * Gbps, assumed=True),
}

# Slice shapes by chip count (Google's supported topologies).
_SHAPES_2D = {
    1: (1, 1),
    4: (2, 2),
    8: (2, 4),
    16: (4, 4),
    32: (4, 8),
    64: (8, 8),
    128: (8, 16),
    256: (16, 16),
}
_SHAPES_3D = {
    4: (2, 2, 1),
    8: (2, 2, 2),
    16: (2, 2, 4),
    32: (2, 4, 4),
    64: (4, 4, 4),
    128: (4, 4, 8),
    256: (4, 8, 8),
    512: (8, 8, 8),
}


class UnknownAcceleratorType(ValueError):
    """An accelerator type this table cannot map to a TPU slice; the message names the known ones."""


@dataclass(frozen=True)
class TpuSlice:
    accelerator_type: str  # as the TPU API spells it: v6e-16
    generation: Generation
    chips: int
    shape: tuple[int, ...]  # chips along each torus axis
    chips_per_host_bounds: tuple[int, int, int]

    @property
    def topology_name(self) -> str:
        """libtpu's name for the slice, e.g. v6e:4x4 or v4:2x2x2."""
        return f"{self.generation.libtpu_name}:{'x'.join(str(s) for s in self.shape)}"

    @property
    def hosts(self) -> int:
        per_host = (
            self.chips_per_host_bounds[0] * self.chips_per_host_bounds[1] * self.chips_per_host_bounds[2]
        )
        return self.chips // per_host


def known_types() -> str:
    examples = ["v6e-8", "v6e-16", "v5litepod-16", "v4-16", "v5p-8"]
    return ", ".join(examples)


def parse_accelerator_type(text: str) -> TpuSlice:
    """`v6e-16` -> the slice (4x4, 4 hosts of 4 chips). Raises UnknownAcceleratorType with the fix."""
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", text.strip().lower())
    if not match:
        raise UnknownAcceleratorType(
            f"accelerator type {text!r} is not GENERATION-COUNT; use one of {known_types()}"
        )
    name, count = ALIASES.get(match.group(1), match.group(1)), int(match.group(2))
    generation = GENERATIONS.get(name)
    if generation is None:
        raise UnknownAcceleratorType(
            f"accelerator type {text!r}: unknown TPU generation {match.group(1)!r}; "
            f"known: {', '.join(GENERATIONS)}"
        )
    if count % generation.cores_per_chip_in_type:
        raise UnknownAcceleratorType(f"accelerator type {text!r}: {name} counts TensorCores, an even number")
    chips = count // generation.cores_per_chip_in_type
    shapes = _SHAPES_2D if generation.torus_dims == 2 else _SHAPES_3D
    if chips not in shapes:
        sizes = ", ".join(f"{name}-{c * generation.cores_per_chip_in_type}" for c in shapes)
        raise UnknownAcceleratorType(
            f"accelerator type {text!r} is not a {name} slice shape; use one of {sizes}"
        )
    shape = shapes[chips]
    if chips <= generation.largest_single_host:
        bounds = (*shape, 1) if len(shape) == 2 else shape
    else:
        bounds = (2, 2, 1)  # multi-host slices: 4 chips a host
    return TpuSlice(f"{name}-{count}", generation, chips, shape, bounds)  # type: ignore[arg-type]
