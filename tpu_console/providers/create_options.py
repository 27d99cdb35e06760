"""What a create may be asked for, read from text the one way that `create`'s flags and the app's create
form both use: the zones (or `auto`), the wait-for duration, the provisioning, and which options go
together. Each bad value is a UserError with one line that names it and the fix."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from tpu_console.errors import UserError
from tpu_console.providers import capacity

PROVISIONING = ("spot", "on-demand", "reservation", "best-effort")  # spot is the default

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def parse_duration(text: str) -> float:
    """`2h`, `45m`, `1h30m`, `90s`, `1d` -> seconds; UserError for anything else."""
    match = _DURATION.match(text.strip().lower())
    if not match or not any(match.groups()):
        raise UserError(f"bad duration {text!r}: write it like 2h, 45m, 1h30m or 90s")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise UserError(f"bad duration {text!r}: it must be longer than zero")
    return float(total)


def is_auto(zones_text: str | None) -> bool:
    return bool(zones_text) and zones_text.strip() == "auto"


def parse_zones(
    zones_text: str | None, configured: list[str], project: str | None, accelerator_type: str,
    slices: int = 1,
) -> tuple[str, ...]:
    """`Z1,Z2` in that order; `auto`: see `auto_zones`; empty: the configured zones."""
    if is_auto(zones_text):
        return auto_zones(configured, project, accelerator_type, slices)
    if zones_text:
        return tuple(z.strip() for z in zones_text.split(",") if z.strip())
    return tuple(configured)


def auto_zones(configured: list[str], project: str | None, accelerator_type: str,
               slices: int = 1) -> tuple[str, ...]:
    """`--zones auto`: the configured zones (and any proven in the record) by what the record says; a
    multislice by its groups' record (`2x v6e-16`), which the gcp provider keeps apart from one slice's."""
    from tpu_console.providers.gcp.accelerators import canonical_type

    canonical = canonical_type(accelerator_type)
    if slices > 1:
        canonical = f"{slices}x {canonical}"
    store = capacity.CapacityStore()
    records = capacity.summarize(store.attempts(canonical, project), datetime.now(UTC))
    zones = capacity.order_zones(list(configured), records, canonical)
    if not zones:
        raise UserError("--zones auto needs [gcp] zones in config.toml (or a capacity record); "
                        "or name zones: --zones europe-west4-a,us-east5-b")
    return tuple(zones)


def check_combination(*, direct: bool, race: bool, provisioning: str = "spot",
                      reservation: str | None = None) -> None:
    """UserError for options that cannot go together (argparse's exclusive group covers the CLI's tiers)."""
    if direct and race:
        raise UserError("--race queues a request in every zone at once; it cannot go with --direct")
    if provisioning not in PROVISIONING:
        raise UserError(f"unknown provisioning {provisioning!r}: pick one of {', '.join(PROVISIONING)}")
    if provisioning == "reservation" and not (reservation or "").strip():
        raise UserError("--reservation needs the reservation's name (in the zone) or its full path")


NO_MULTISLICE_FAMILIES = ("v2", "v3")  # Multislice needs v4 or later (the TPU docs' Multislice page)


def check_slices(slices: int, provider: str, accelerator_type: str, *, direct: bool, race: bool) -> None:
    """UserError for a slice count this provider or type cannot create (before anything is requested)."""
    if slices < 1:
        raise UserError(f"--slices {slices}: use a whole number of slices, 1 or more")
    if slices == 1:
        return
    if provider not in ("local", "gcp"):
        raise UserError(f"--slices: the {provider} provider has no Multislice; create with --provider gcp "
                        "(a queued resource with a node count) or local (a rehearsal)")
    if provider == "local":
        from tpu_console.providers.local.shapes import MAX_WORKERS, parse_local_type

        hosts = parse_local_type(accelerator_type).workers * slices
        if hosts > MAX_WORKERS:
            raise UserError(f"--slices {slices} x {accelerator_type} is {hosts} local workers, more than "
                            f"{MAX_WORKERS}; use fewer slices or a smaller type")
        return
    from tpu_console.providers.gcp.accelerators import canonical_type

    family = canonical_type(accelerator_type).split("-")[0]
    if family in NO_MULTISLICE_FAMILIES:
        raise UserError(f"--slices: {accelerator_type} has no Multislice (v2 and v3 cannot join slices over "
                        "the data-center network); use v4, v5e, v5p or v6e, or one larger slice")
    if direct:
        raise UserError("--slices: the TPU API makes a multislice only as a queued resource; "
                        "leave out --direct")
    # --race is fine: each zone's request is the whole group (its slices all in that zone), and the
    # losers go as soon as one is ACTIVE, as for one slice.
