"""How a node reads as a row: the columns `tpu-console ls` prints and the TUI's node table shows,
and the JSON record `ls --json` emits. Pure functions of a node and the current time."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tpu_console.model import Node
from tpu_console.pricing import cost_since_creation, price_per_hour

COLUMNS = ("NAME", "PROVIDER", "TYPE", "WORKERS", "STATE", "ZONE", "SPOT", "AGE", "PRICE/H", "COST")


def format_age(created_at: datetime | None, now: datetime) -> str:
    """Compact age like `42s`, `17m`, `3h12m`, `2d4h`; `-` when unknown."""
    if created_at is None:
        return "-"
    seconds = max(0, int((now - _aware(created_at)).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if hours == 0:
        return f"{minutes}m"
    if days == 0:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"


def node_row(node: Node, now: datetime) -> tuple[str, ...]:
    """One row of text cells, in COLUMNS order."""
    return (
        node.name,
        node.provider,
        node.accelerator_type,
        str(node.shape.workers),
        str(node.state),
        node.zone or "-",
        "spot" if node.spot else "-",
        format_age(node.created_at, now),
        format_price(node),
        format_cost(node, now),
    )


def format_price(node: Node) -> str:
    """Approximate list price per hour (`~$12.34`), `-` for nodes without one (local, ssh)."""
    estimate = price_per_hour(node)
    return f"~${estimate.per_hour:,.2f}" if estimate else "-"


def format_cost(node: Node, now: datetime) -> str:
    """Approximate spend since creation (`~$546`), so a forgotten node shows what it has cost."""
    cost = cost_since_creation(node, now)
    return f"~${cost:,.0f}" if cost is not None else "-"


def node_record(node: Node, now: datetime) -> dict[str, Any]:
    """The JSON form of a node: everything a script may want, with plain types only."""
    estimate = price_per_hour(node)
    return {
        "name": node.name,
        "provider": node.provider,
        "accelerator_type": node.accelerator_type,
        "workers": node.shape.workers,
        "devices_per_worker": node.shape.devices_per_worker,
        "chips": node.shape.chips,
        "state": str(node.state),
        "health": node.health,
        "state_reason": node.state_reason,
        "zone": node.zone,
        "spot": node.spot,
        "runtime_version": node.runtime_version,
        "created_at": _aware(node.created_at).isoformat() if node.created_at else None,
        "age_s": int((now - _aware(node.created_at)).total_seconds()) if node.created_at else None,
        "labels": dict(node.labels),
        "price_per_hour": round(estimate.per_hour, 4) if estimate else None,
        "price_on_demand_per_hour": round(estimate.on_demand_per_hour, 4) if estimate else None,
        "price_spot_per_hour": round(estimate.spot_per_hour, 4) if estimate else None,
        "cost_since_creation": round(cost, 2)
        if (cost := cost_since_creation(node, now)) is not None
        else None,
        "price_currency": estimate.currency if estimate else None,
        "price_as_of": estimate.as_of if estimate else None,
        "hosts": [
            {
                "worker": w.index,
                "host": w.host,
                "port": w.port,
                "internal_ip": w.internal_ip,
                "external_ip": w.external_ip,
            }
            for w in node.workers
        ],
    }


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns separated by two spaces, like `kubectl get`."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    return "\n".join(lines)


def _aware(moment: datetime) -> datetime:
    # Providers should give aware datetimes; a naive one is taken as UTC rather than local time.
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
