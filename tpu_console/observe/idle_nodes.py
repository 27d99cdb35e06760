"""Idle nodes: READY, no live run, and nothing run for longer than `idle_after_minutes`. The node that bills
all night because its run ended at 1 a.m. is the most expensive mistake on a TPU pod; the console flags it
(`tpu-console idle`, the app's nodes screen) with what it has cost so far, and deletes it when asked.

Pure: it judges from the node listing and the run history, which the callers read (and probe) first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from tpu_console.domain import Node, NodeState
from tpu_console.history.store import RunRecord
from tpu_console.pricing import cost_since_creation, price_per_hour


@dataclass(frozen=True)
class IdleNode:
    node: Node
    idle_since: datetime  # when its last run ended, or when it was created if it never ran one
    idle_for: timedelta
    cost_so_far: float | None  # since creation, at its list price (None without a price: local pods)
    cost_while_idle: float | None

    def describe(self) -> str:
        minutes = int(self.idle_for.total_seconds() // 60)
        span = f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"
        cost = f", ~${self.cost_while_idle:,.2f} while idle (~${self.cost_so_far:,.0f} in all)" if (
            self.cost_while_idle is not None and self.cost_so_far is not None) else ""
        return f"{self.node.name} idle for {span}{cost}"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def find_idle(
    nodes: Iterable[Node], runs: Iterable[RunRecord], now: datetime, idle_after: timedelta
) -> list[IdleNode]:
    """The READY nodes with no run in progress whose last activity is older than `idle_after`."""
    runs = list(runs)
    idle = []
    for node in nodes:
        if node.state is not NodeState.READY or node.created_at is None:
            continue
        created = _aware(node.created_at)
        # Runs of an earlier node of the same name (deleted, then created again) do not count.
        own = [
            r
            for r in runs
            if r.node == node.name and r.provider == node.provider and _aware(r.started_at) >= created
        ]
        if any(not r.finished for r in own):
            continue
        ends = [_aware(r.finished_at) for r in own if r.finished_at is not None]
        since = max([created, *ends])
        idle_for = _aware(now) - since
        if idle_for < idle_after:
            continue
        price = price_per_hour(node)
        while_idle = price.per_hour * idle_for.total_seconds() / 3600 if price is not None else None
        idle.append(IdleNode(node, since, idle_for, cost_since_creation(node, now), while_idle))
    return idle
