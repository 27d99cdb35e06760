"""Managed runs as the CLI (`controller status`, `runs show`) and the app (`M`) show them: the acting
controller, a row per managed run, and one run's incarnations and recoveries (controller/state.py)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from tpu_console.controller import state as st
from tpu_console.controller.state import ManagedRun
from tpu_console.history.goodput import goodput
from tpu_console.views.nodes import format_table


def describe_lease(lease: dict[str, Any] | None) -> str:
    if lease is None:
        return "none (start one with `tpu-console controller start`)"
    holder = lease.get("holder") or {}
    age = time.time() - float(lease.get("renewed_at") or 0)
    stale = " (stale: it stopped renewing)" if age > float(lease.get("ttl_s") or 60) else ""
    return (f"{holder.get('where', '?')} on {holder.get('host', '?')} (pid {holder.get('pid', '?')}), last "
            f"heartbeat {age:.0f} s ago{stale}")


MANAGED_COLUMNS = ("MANAGED", "NODE", "STATUS", "RUN", "INCARNATIONS", "RECOVERIES", "LAST LOOK", "NOTE")


def managed_row(run: ManagedRun) -> tuple[str, ...]:
    seen = run.heartbeat.get("at") if run.heartbeat else None
    return (run.id, run.node, run.status, run.current.run_id or "-", str(len(run.incarnations)),
            f"{len(run.recoveries)}/{run.max_recoveries}",
            f"{time.time() - seen:.0f}s ago" if seen else "-", run.note or "")


def _moment(at: float | None) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%m-%d %H:%M:%S") if at else "-"


def incarnation_lines(run: ManagedRun) -> list[str]:
    """A managed run at a glance: each incarnation (node, zone, from-to, how it ended) and each recovery's
    seconds from the loss to the first new step, what they were made of, and the steps lost."""
    rows = [(str(i.n), i.node, i.zone or "-", i.run_id or "-", _moment(i.created_at), _moment(i.ended_at),
             i.ended or ("running" if not run.state.terminal else run.status.lower()))
            for i in run.incarnations]
    lines = [f"managed run {run.id}: {run.status}" + (f" ({run.note})" if run.note else ""),
             format_table(("#", "NODE", "ZONE", "RUN", "FROM", "TO", "ENDED"), rows)]
    share = goodput(st.timeline(run, time.time()))
    if share.total_s > 0:
        lines.append(f"{share.line()} (over every incarnation)")
    for r in run.recoveries:
        parts = ", ".join(f"{k} {v:.0f}s" for k, v in r.parts().items() if v is not None)
        seconds = f"{r.seconds:.0f} s to the first new step" if r.seconds is not None else "no new step yet"
        lost = f", {r.steps_lost} step(s) lost" if r.steps_lost is not None else ""
        lines.append(f"recovery {r.n} ({r.reason}): {seconds}{lost}" + (f" ({parts})" if parts else ""))
    return lines
