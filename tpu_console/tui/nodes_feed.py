"""What the nodes screen shows, gathered in one place: every provider's nodes, each node's latest run
(unfinished ones probed, so a run that ended while nobody looked does not read `running`), and the
READY nodes that sit idle. The screen's background worker calls `gather_listing`; nothing here draws."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from tpu_console import locations
from tpu_console.domain import Node, NodeState, QueuedRequest
from tpu_console.errors import one_line
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.observe.idle_nodes import IdleNode, find_idle
from tpu_console.providers.base import NodeListing, Provider
from tpu_console.providers.nodes import list_nodes

HISTORY_LIMIT = 500
# A probe that takes longer (an unreachable worker) is given up for this refresh; the next one retries.
PROBE_TIMEOUT_S = 20.0


@dataclass
class NodesListing:
    nodes: list[Node] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    latest_runs: dict[str, RunRecord] = field(default_factory=dict)  # node key -> its latest run
    idle: dict[str, IdleNode] = field(default_factory=dict)  # node key -> how long it has idled
    requests: list[QueuedRequest] = field(default_factory=list)  # queued requests, with a node or not

    def latest_run(self, node: Node) -> RunRecord | None:
        return self.latest_runs.get(node_key(node))

    def idle_since(self, node: Node) -> IdleNode | None:
        return self.idle.get(node_key(node))


def node_key(node: Node) -> str:
    """Names are unique per provider and zone only: a local and a gcp node may both be called `demo`, and
    gcp may have a `demo` in each zone (a race whose losers were never deleted)."""
    return f"{node.provider}/{node.zone or ''}/{node.name}"


async def gather_listing(
    providers: dict[str, Provider], store: RunStore | None, now: datetime, idle_after: timedelta,
    probe: bool = True,
) -> NodesListing:
    """The listing; with `probe`, unfinished runs of READY nodes are asked for their state (SSH to every
    worker of those nodes: the screen does it on demand and at most once a minute, not every refresh)."""
    try:
        listing = await list_nodes(providers)
    except Exception as exc:  # noqa: BLE001 - shown on screen; the next refresh may succeed
        listing = NodeListing(problems=[f"listing failed: {one_line(exc)}"])
    runs = await asyncio.to_thread(_history, store)
    latest = {node_key(node): record for node in listing.nodes if (record := _latest_run(node, runs))}
    unfinished = [latest[node_key(n)] for n in listing.nodes
                  if probe and n.state is NodeState.READY and node_key(n) in latest
                  and not latest[node_key(n)].finished]
    probed = {r.run_id: r for r in await _probed(providers, unfinished, store)}
    if probed:
        runs = [probed.get(r.run_id, r) for r in runs]
        latest = {key: probed.get(r.run_id, r) for key, r in latest.items()}
    idle = {node_key(i.node): i for i in find_idle(listing.nodes, runs, now, idle_after)}
    return NodesListing(listing.nodes, listing.problems, latest, idle, listing.requests)


def with_history(listing: NodesListing, store: RunStore | None, now: datetime,
                 idle_after: timedelta) -> NodesListing:
    """The listing with each node's latest run and the idle nodes read from the history again, no provider
    asked: what a run launched elsewhere (the CLI, another console) changes."""
    runs = _history(store)
    latest = {node_key(node): record for node in listing.nodes if (record := _latest_run(node, runs))}
    idle = {node_key(i.node): i for i in find_idle(listing.nodes, runs, now, idle_after)}
    return replace(listing, latest_runs=latest, idle=idle)


def latest_run_now(node: Node, store: RunStore | None) -> RunRecord | None:
    """The node's latest run as the history has it at this moment (a launch from the CLI included)."""
    try:
        return _latest_run(node, (store or RunStore()).list(node.name, 20))
    except Exception:  # noqa: BLE001 - as _history: the caller falls back to what it listed
        return None


def history_version(store: RunStore | None) -> int | None:
    """Changes whenever the history is written (by this console or another process): its file's mtime."""
    try:
        return (store.path if store is not None else locations.database_file()).stat().st_mtime_ns
    except OSError:
        return None


def _latest_run(node: Node, runs: Sequence[RunRecord]) -> RunRecord | None:
    """The node's most recent run; not one of an earlier node of the same name (deleted, made again)."""
    for record in runs:  # most recent first
        if record.node != node.name or record.provider != node.provider:
            continue
        if node.created_at is not None and _aware(record.started_at) < _aware(node.created_at):
            return None
        return record
    return None


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _history(store: RunStore | None) -> list[RunRecord]:
    try:
        return (store or RunStore()).list(limit=HISTORY_LIMIT)
    except Exception:  # noqa: BLE001 - the history is a nicety on this screen, never a reason to fail
        return []


async def _probed(providers: dict[str, Provider], records: Sequence[RunRecord],
                  store: RunStore | None) -> list[RunRecord]:
    """The records with the state their workers report now (the history is updated as `runs` does)."""
    if not records:
        return []
    from tpu_console.observe import lookup

    store = store or RunStore()
    try:
        views = await asyncio.wait_for(lookup.observe(providers, records, store), PROBE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the recorded state stays; the run dashboard says what is wrong
        return []
    probed = []
    for view in views:
        if view.live:
            try:
                probed.append(store.get(view.record.run_id))
            except Exception:  # noqa: BLE001 - fall back to what the probe saw
                probed.append(view.record)
    return probed
