"""Cloud TPU accelerator types: how many hosts and devices a type has, and its default runtime image.

Source: the Cloud TPU system-architecture pages for each generation (cloud.google.com/tpu/docs/v4,
/v5e, /v5p, /v6e), as read in 2025; checked against real pods (v6e-16 = 4 hosts x 4 chips,
v4-16 = 2 hosts x 4 devices).

| family | name counts | chips | hosts | JAX devices per host |
| --- | --- | --- | --- | --- |
| v2, v3 | TensorCores | N/2 | N/8 (min 1) | 8 (one per core) |
| v4, v5p | TensorCores | N/2 | chips/4 (min 1) | 4 (megacore: one device per chip) |
| v5e (`v5litepod-N`) | chips | N | 1 if N <= 8, else N/4 | N if one host, else 4 |
| v6e | chips | N | 1 if N <= 8, else N/4 | N if one host, else 4 |

`v5e-N` is accepted as another spelling of `v5litepod-N`, the name the API uses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpu_console.domain import AcceleratorShape
from tpu_console.errors import UserError


@dataclass(frozen=True)
class Family:
    name: str  # the family as people say it: "v6e", "v5e"
    api_prefix: str  # the prefix in the API's accelerator type: "v6e", "v5litepod"
    counts_cores: bool  # the number in the name counts TensorCores (2 per chip), not chips
    devices_per_chip: int  # JAX devices per chip: 2 on v2/v3 (no megacore), else 1
    chips_per_host: int  # on multi-host slices
    max_single_host_chips: int  # the largest slice that fits on one host
    default_runtime: str


FAMILIES: dict[str, Family] = {
    f.api_prefix: f
    for f in (
        Family("v2", "v2", True, 2, 4, 4, "tpu-ubuntu2204-base"),
        Family("v3", "v3", True, 2, 4, 4, "tpu-ubuntu2204-base"),
        Family("v4", "v4", True, 1, 4, 4, "tpu-ubuntu2204-base"),
        Family("v5p", "v5p", True, 1, 4, 4, "v2-alpha-tpuv5"),
        Family("v5e", "v5litepod", False, 1, 4, 8, "v2-alpha-tpuv5-lite"),
        Family("v6e", "v6e", False, 1, 4, 8, "v6e-ubuntu-2404"),
    )
}

_TYPE = re.compile(r"^([a-z0-9]+)-(\d+)$")
_ALIASES = {"v5e": "v5litepod"}


def known_families() -> str:
    return ", ".join(f"{f.name} ({f.api_prefix}-N)" for f in FAMILIES.values())


def canonical_type(accelerator_type: str) -> str:
    """The API's spelling of a type: `v5e-16` -> `v5litepod-16`. Raises UserError for an unknown one."""
    family, size = _parse(accelerator_type)
    return f"{family.api_prefix}-{size}"




def shape_for(accelerator_type: str) -> AcceleratorShape:
    """Hosts and devices of a type. Raises UserError naming the known families for an unknown type."""
    family, size = _parse(accelerator_type)
    chips = size // 2 if family.counts_cores else size
    if chips < 1 or (family.counts_cores and size % 2):
        raise UserError(f"accelerator type {accelerator_type!r} has an odd TensorCore count; use e.g. "
                        f"{family.api_prefix}-8")
    if chips <= family.max_single_host_chips:
        workers, chips_per_worker = 1, chips
    elif chips % family.chips_per_host:
        raise UserError(f"accelerator type {accelerator_type!r} does not split into hosts of "
                        f"{family.chips_per_host} chips; check the size")
    else:
        workers, chips_per_worker = chips // family.chips_per_host, family.chips_per_host
    return AcceleratorShape(
        accelerator_type=f"{family.api_prefix}-{size}",
        workers=workers,
        devices_per_worker=chips_per_worker * family.devices_per_chip,
        chips=chips,
    )


def shape_of_listed_node(accelerator_type: str, endpoint_count: int) -> AcceleratorShape:
    """The shape of a node the API returned. Never raises: the node's network endpoints (one per host)
    are the truth for the worker count, and an unknown type still lists, with 0 devices."""
    try:
        shape = shape_for(accelerator_type)
    except UserError:
        return AcceleratorShape(accelerator_type, max(endpoint_count, 1), 0, 0)
    if endpoint_count and endpoint_count != shape.workers:
        total = shape.total_devices
        per_worker = total // endpoint_count if total % endpoint_count == 0 else shape.devices_per_worker
        return AcceleratorShape(shape.accelerator_type, endpoint_count, per_worker, shape.chips)
    return shape


def default_runtime_version(accelerator_type: str) -> str:
    return _parse(accelerator_type)[0].default_runtime


def _parse(accelerator_type: str) -> tuple[Family, int]:
    match = _TYPE.match(accelerator_type.strip().lower())
    prefix = _ALIASES.get(match.group(1), match.group(1)) if match else None
    if not match or prefix not in FAMILIES:
        raise UserError(
            f"unknown accelerator type {accelerator_type!r}: use one of the families {known_families()}, "
            "e.g. v6e-8, v6e-16, v4-16, v5litepod-16, v5p-8"
        )
    size = int(match.group(2))
    if size < 1:
        raise UserError(f"accelerator type {accelerator_type!r} needs a positive size, e.g. v6e-8")
    return FAMILIES[prefix], size
