"""What a node costs: an approximate price per hour from a shipped, dated table of per-chip-hour list
prices (`tpu_console/data/tpu_prices.toml`), and the running cost since the node was created.

Approximate by design: regions, discounts and price changes are not modelled; the table's `as_of` date
travels with every estimate so the screen can say how old the numbers are.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources

from tpu_console.domain import Node

# Accelerator type prefix -> price family (the API calls v5e "v5litepod").
_FAMILY_OF_PREFIX = {"v4": "v4", "v5litepod": "v5e", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}


@dataclass(frozen=True)
class PriceTable:
    as_of: str
    currency: str
    source: str
    per_chip_hour: dict[str, tuple[float, float]]  # family -> (on-demand, spot)


@dataclass(frozen=True)
class PriceEstimate:
    family: str
    chips: int
    on_demand_per_hour: float
    spot_per_hour: float
    spot: bool  # which of the two the node pays
    as_of: str
    currency: str

    @property
    def per_hour(self) -> float:
        return self.spot_per_hour if self.spot else self.on_demand_per_hour

    def describe(self) -> str:
        return (f"~${self.on_demand_per_hour:,.2f}/h on-demand, ~${self.spot_per_hour:,.2f}/h spot "
                f"({self.chips} chips, {self.family} list price as of {self.as_of})")


@functools.cache
def load_table() -> PriceTable:
    text = resources.files("tpu_console").joinpath("data/tpu_prices.toml").read_text()
    data = tomllib.loads(text)
    return PriceTable(
        as_of=data["as_of"],
        currency=data["currency"],
        source=data["source"],
        per_chip_hour={
            family: (float(p["on_demand"]), float(p["spot"])) for family, p in data["families"].items()
        },
    )


def price_family(accelerator_type: str) -> str | None:
    """`v6e-16` -> `v6e`, `v5litepod-8` -> `v5e`; None for types without a price (local, v2, ...)."""
    match = re.match(r"^([a-z0-9]+)-\d+$", accelerator_type)
    return _FAMILY_OF_PREFIX.get(match.group(1)) if match else None


def price_per_hour(node: Node, table: PriceTable | None = None) -> PriceEstimate | None:
    """The node's approximate hourly price, or None when it has no list price (local, ssh, unknown)."""
    if node.provider != "gcp":
        return None
    table = table or load_table()
    family = price_family(node.accelerator_type)
    if family is None or family not in table.per_chip_hour or node.shape.chips <= 0:
        return None
    on_demand, spot = table.per_chip_hour[family]
    chips = node.shape.chips
    return PriceEstimate(
        family, chips, on_demand * chips, spot * chips, node.spot, table.as_of, table.currency
    )


def run_cost(
    price_per_hour: float | None,
    started_at: datetime,
    finished_at: datetime | None,
    now: datetime | None = None,
) -> float | None:
    """What a run cost: the node's price per hour times the hours from launch to end (or to now while it
    runs). The node bills for all its chips whether the run uses them or not, so this is chip-hours x
    price."""
    if price_per_hour is None:
        return None
    end = finished_at or now or datetime.now(UTC)
    return price_per_hour * max(0.0, (end - started_at).total_seconds() / 3600)


def cost_since_creation(
    node: Node, now: datetime | None = None, table: PriceTable | None = None
) -> float | None:
    """Approximate spend since `created_at` at the price the node pays (spot or on-demand).

    A node bills while it exists, whatever its state, so a preempted spot node is counted too: that
    overstates (Google does not bill preempted time) but errs on the side of deleting it.
    """
    estimate = price_per_hour(node, table)
    if estimate is None or node.created_at is None:
        return None
    now = now or datetime.now(UTC)
    created = node.created_at if node.created_at.tzinfo else node.created_at.replace(tzinfo=UTC)
    hours = max(0.0, (now - created).total_seconds() / 3600)
    return estimate.per_hour * hours
