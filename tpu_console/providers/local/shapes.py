"""Accelerator types a local pod accepts: `local-WxD` and aliases that rehearse real TPU shapes."""

from __future__ import annotations

import re

from tpu_console.domain import AcceleratorShape
from tpu_console.errors import UserError

# Aliases keep the real type's worker count and devices per worker, so a run rehearsed locally
# meets the same multi-host layout (and the same mesh arithmetic) as on the pod.
ALIASES: dict[str, tuple[int, int]] = {
    "local-v6e-8": (1, 8),
    "local-v6e-16": (4, 4),
    "local-v4-16": (2, 4),
}

MAX_WORKERS = 1024  # a v4-4096 is 512 hosts; the fan-out benchmark goes to 1,024
MAX_DEVICES_PER_WORKER = 64

_GRID = re.compile(r"^local-(\d+)x(\d+)$")


def valid_types_hint() -> str:
    return "use local-WxD (W workers x D CPU devices, e.g. local-2x4) or one of " + ", ".join(ALIASES)


def parse_local_type(accelerator_type: str) -> AcceleratorShape:
    """The shape of a local accelerator type, or UserError naming the valid types."""
    if accelerator_type in ALIASES:
        workers, devices = ALIASES[accelerator_type]
    elif match := _GRID.match(accelerator_type):
        workers, devices = int(match[1]), int(match[2])
        if not (1 <= workers <= MAX_WORKERS and 1 <= devices <= MAX_DEVICES_PER_WORKER):
            raise UserError(
                f"local accelerator type {accelerator_type!r} is out of range: W must be 1-{MAX_WORKERS} "
                f"and D 1-{MAX_DEVICES_PER_WORKER}; {valid_types_hint()}"
            )
    else:
        raise UserError(f"unknown local accelerator type {accelerator_type!r}; {valid_types_hint()}")
    return AcceleratorShape(
        accelerator_type=accelerator_type,
        workers=workers,
        devices_per_worker=devices,
        chips=workers * devices,
    )
