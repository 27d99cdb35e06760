"""How a node reads as a row: the columns `tpu-console ls` prints and the TUI's node table shows,
and the JSON record `ls --json` emits; the same for a queued request, and the notes on a node (its
request, health, symptoms, maintenance). Pure functions of a node and the current time."""

from __future__ import annotations

import os
import shlex
from datetime import UTC, datetime
from typing import Any

from tpu_console.domain import Maintenance, Node, QueuedRequest, QueueState
from tpu_console.pricing import cost_since_creation, price_per_hour

COLUMNS = ("NAME", "PROVIDER", "TYPE", "WORKERS", "STATE", "ZONE", "SPOT", "AGE", "PRICE/H", "COST")
REQUEST_COLUMNS = ("QUEUED REQUEST", "PROVIDER", "TYPE", "TIER", "STATE", "ZONE", "AGE")
HOLDS_QUOTA = "holds quota until deleted"


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
        type_text(node),
        str(node.shape.workers),
        state_cell(node),
        node.zone or "-",
        "spot" if node.spot else "-",
        format_age(node.created_at, now),
        format_price(node),
        format_cost(node, now),
    )


def type_text(node: Node) -> str:
    """The accelerator type, as `2x v6e-16` for a multislice node."""
    return f"{node.slices}x {node.accelerator_type}" if node.slices > 1 else node.accelerator_type


def state_cell(node: Node) -> str:
    """The state; a multislice's says how its slices stand: `READY 2/2`, or the worst slice's state and
    which slices are in it, `PREEMPTED (slice 1 of 2)`."""
    states, count = node.slice_states, node.slices
    if count < 2 or not states:
        return str(node.state)
    if all(s == node.state for s in states):
        return f"{node.state} {count}/{count}"
    which = [str(i) for i, s in enumerate(states) if s == node.state] or [
        str(i) for i, s in enumerate(states) if s != "READY"]
    return f"{node.state} (slice{'s' if len(which) > 1 else ''} {', '.join(which)} of {count})"


def slice_notes(node: Node) -> list[str]:
    """A multislice with a slice not READY: which, and that the group runs only whole."""
    bad = [f"slice {i} ({node.slice_names[i]}) {s}" for i, s in enumerate(node.slice_states) if s != "READY"]
    if node.slices < 2 or not bad:
        return []
    return [f"{'; '.join(bad)}: its {node.slices} slices run as one, so it cannot be launched on until "
            f"it is recreated (`tpu-console delete {node.name} --yes`, then create it again)"]


def format_price(node: Node) -> str:
    """Approximate list price per hour (`~$12.34`), `-` for nodes without one (local, ssh)."""
    estimate = price_per_hour(node)
    return f"~${estimate.per_hour:,.2f}" if estimate else "-"


def format_cost(node: Node, now: datetime) -> str:
    """Approximate spend since creation (`~$546`), so a forgotten node shows what it has cost."""
    cost = cost_since_creation(node, now)
    return f"~${cost:,.0f}" if cost is not None else "-"


def request_state(request: QueuedRequest, now: datetime) -> str:
    """`WAITING 12m` (queued for capacity since), `PROVISIONING`, `FAILED: reason`, `SUSPENDED`."""
    if request.state.waiting:
        return f"WAITING {format_age(request.created_at, now)}"
    if request.state is QueueState.FAILED:
        return f"FAILED: {request.reason or 'no reason given'}"
    return str(request.state)


def request_row(request: QueuedRequest, now: datetime) -> tuple[str, ...]:
    """One row in REQUEST_COLUMNS order; a request that holds quota says so."""
    state = request_state(request, now)
    if request.state.holds_quota:
        state += f" ({HOLDS_QUOTA})"
    kind = f"{request.slices}x {request.accelerator_type}" if request.slices > 1 else request.accelerator_type
    return (request.name, request.provider, kind or "-", request.provisioning, state,
            request.zone or "-", format_age(request.created_at, now))


def request_record(request: QueuedRequest, now: datetime) -> dict[str, Any]:
    return {
        "name": request.name,
        "provider": request.provider,
        "zone": request.zone,
        "accelerator_type": request.accelerator_type,
        "slices": request.slices,
        "provisioning": request.provisioning,
        "state": str(request.state),
        "reason": request.reason,
        "has_node": request.has_node,
        "holds_quota": request.state.holds_quota,
        "created_at": _aware(request.created_at).isoformat() if request.created_at else None,
        "age_s": int((now - _aware(request.created_at)).total_seconds()) if request.created_at else None,
    }


def maintenance_text(maintenance: Maintenance) -> str:
    """`maintenance SCHEDULED PENDING 2026-11-25 03:00-05:00 UTC`."""
    window = ""
    if maintenance.starts_at is not None:
        start = _aware(maintenance.starts_at).astimezone(UTC)
        window = f" {start:%Y-%m-%d %H:%M}"
        if maintenance.ends_at is not None:
            window += f"-{_aware(maintenance.ends_at).astimezone(UTC):%H:%M}"
        window += " UTC"
    return f"maintenance {maintenance.kind} {maintenance.status}{window}"


def maintenance_warning(node: Node, run_started_at: datetime, run_ended_at: datetime | None) -> str | None:
    """The run dashboard's warning when the node's announced maintenance falls while the run runs."""
    ended = _aware(run_ended_at) if run_ended_at else None
    if node.maintenance is None or not node.maintenance.overlaps(_aware(run_started_at), ended):
        return None
    return f"{maintenance_text(node.maintenance)} on {node.name}, while this run runs: checkpoint before it"


def run_node_warning(node: Node, run_started_at: datetime, run_ended_at: datetime | None) -> str | None:
    """The run dashboard's warning about the run's node: health other than HEALTHY, its symptoms, and
    maintenance that falls while the run runs."""
    parts = []
    if node.health and node.health != "HEALTHY":
        parts.append(f"{node.name} health {node.health}")
    parts.extend(f"symptom {symptom}" for symptom in node.symptoms)
    maintenance = maintenance_warning(node, run_started_at, run_ended_at)
    if maintenance:
        parts.append(maintenance)
    return "; ".join(parts) or None


def node_notes(node: Node) -> list[str]:
    """What a person should know about a node beyond its row: the queued request behind it, health
    other than HEALTHY, symptoms, upcoming maintenance, quota still held."""
    notes = []
    if node.queued_request:
        notes.append(f"queued request {node.queued_request}")
    if node.health and node.health != "HEALTHY":
        notes.append(f"health {node.health}")
    notes.extend(f"symptom {symptom}" for symptom in node.symptoms)
    if node.maintenance is not None:
        notes.append(maintenance_text(node.maintenance))
    notes.extend(slice_notes(node))
    if node.state.holds_quota:
        notes.append(f"{node.state}: {HOLDS_QUOTA}")
    return notes


def node_record(node: Node, now: datetime) -> dict[str, Any]:
    """The JSON form of a node: everything a script may want, with plain types only."""
    estimate = price_per_hour(node)
    return {
        "name": node.name,
        "provider": node.provider,
        "accelerator_type": node.accelerator_type,
        "workers": node.shape.workers,
        "slices": node.slices,
        "slice_names": list(node.slice_names),
        "slice_states": list(node.slice_states),
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
        "queued_request": node.queued_request,
        "symptoms": list(node.symptoms),
        "upcoming_maintenance": _maintenance_record(node.maintenance),
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
                "slice": node.slice_of(w.index),
                "host": w.host,
                "port": w.port,
                "internal_ip": w.internal_ip,
                "external_ip": w.external_ip,
            }
            for w in node.workers
        ],
    }


def _maintenance_record(maintenance: Maintenance | None) -> dict[str, Any] | None:
    if maintenance is None:
        return None
    return {
        "type": maintenance.kind,
        "status": maintenance.status,
        "window_start": _aware(maintenance.starts_at).isoformat() if maintenance.starts_at else None,
        "window_end": _aware(maintenance.ends_at).isoformat() if maintenance.ends_at else None,
    }


def what_ran(record: Any, width: int = 30) -> str:
    """What a run ran, short: its job file's name, its command, or the trainer config's file name."""
    job = getattr(record, "job", None) or {}
    if job.get("kind") == "command" and job.get("job_file"):
        text = os.path.basename(job["job_file"])
    elif job.get("kind") == "command":
        text = shlex.join(job.get("command") or [])
    else:
        text = os.path.basename(record.config_path) or record.config_path
    return text if len(text) <= width else text[: width - 1] + "…"


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
