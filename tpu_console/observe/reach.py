"""Reaching a run's node: its workers over one Fleet, or why they cannot be reached (node gone, unusable,
no SSH access). Shared by the one-shot calls (control.py) and the live watcher (watch.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_console.domain import Node
from tpu_console.errors import NotFound, UserError, one_line
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import unreachable_workers
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node


@dataclass
class NodeWorkers:
    """A node's workers reached for some runs, or why they could not be."""

    fleet: Fleet | None = None
    problem: str | None = None
    node_gone: bool = False
    provider: Provider | None = None
    node: Node | None = None  # as read when it was reached


class reach_node:
    """`async with reach_node(providers, node) as r`: r.fleet connected to the node's workers, or
    r.problem."""

    def __init__(self, providers: dict[str, Provider], node: str) -> None:
        self._providers, self._node = providers, node
        self._state = NodeWorkers()

    async def __aenter__(self) -> NodeWorkers:
        try:
            provider, node = await find_node(self._providers, self._node)
        except NotFound:
            self._state.problem, self._state.node_gone = f"node {self._node!r} no longer exists", True
            return self._state
        if not node.ready_slices:  # a multislice with a slice lost: the others' runs are still read
            self._state.problem, self._state.node_gone = f"node {self._node!r} is {node.state}", True
            return self._state
        try:
            targets = await provider.ssh_targets(node)
        except UserError as exc:
            self._state.problem = one_line(exc)
            return self._state
        fleet = Fleet(targets)
        self._state.fleet, self._state.provider, self._state.node = fleet, provider, node
        await unreachable_workers(fleet, list(fleet.targets))  # connect all at once, up front
        return self._state

    async def __aexit__(self, *exc_info: object) -> None:
        if self._state.fleet is not None:
            await self._state.fleet.close()
