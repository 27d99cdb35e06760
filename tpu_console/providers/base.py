"""The provider protocol: what every source of nodes offers to the CLI and the TUI."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tpu_console.domain import CreateRequest, Node, QueuedRequest, SshTarget

# Progress callbacks receive one short human line, e.g. "us-east5-b: no capacity, trying next zone".
Progress = Callable[[str], None]


def no_progress(_line: str) -> None:
    """A Progress that shows nothing."""


@dataclass
class NodeListing:
    """A listing is partial when some location failed: the nodes that could be read, and what failed."""

    nodes: list[Node] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each, e.g. "zone us-east1-d: 503 ..."
    requests: list[QueuedRequest] = field(default_factory=list)  # queued requests, with a node or not


class Provider(abc.ABC):
    name: ClassVar[str]

    @abc.abstractmethod
    async def list_nodes(self) -> NodeListing: ...

    @abc.abstractmethod
    async def get(self, name: str) -> Node:
        """Return the node, or raise `errors.NotFound` naming the fix."""

    async def create(self, request: CreateRequest, progress: Progress = no_progress) -> Node:
        from tpu_console.errors import UserError

        raise UserError(f"the {self.name} provider cannot create nodes; define them in config.toml instead")

    async def delete(self, name: str, progress: Progress = no_progress) -> None:
        from tpu_console.errors import UserError

        raise UserError(f"the {self.name} provider cannot delete nodes; remove them from config.toml instead")

    async def delete_queued(self, request: QueuedRequest, progress: Progress = no_progress) -> None:
        """Delete one queued request (in its zone) and confirm it is gone."""
        from tpu_console.errors import UserError

        raise UserError(f"the {self.name} provider has no queued requests")

    async def recreate_slice(self, name: str, index: int, progress: Progress = no_progress) -> None:
        """Make slice `index` of a multislice node again, once it is lost (READY when done). A provider
        that makes a multislice whole or not at all (the TPU API's queued resource) cannot."""
        from tpu_console.errors import UserError

        raise UserError(f"the {self.name} provider cannot make one slice of {name} again; the run stays on "
                        "the slices left")

    async def cancel_requests(  # noqa: B027 - a provider without queued requests keeps this
        self, requests: list[str], progress: Progress = no_progress
    ) -> None:
        """Delete queued requests a create left out when interrupted (`CreateInterrupted.requests`), and
        confirm each is gone. Only providers that queue requests have any."""

    @abc.abstractmethod
    async def ssh_targets(self, node: Node) -> list[SshTarget]:
        """How to reach each worker of a READY node (worker 0 first). Raises UserError if it is not usable."""

    def coordinator_env(self, node: Node, targets: list[SshTarget]) -> dict[str, str]:
        """Environment the trainer needs to find its peers. Empty on TPU VMs, where JAX discovers them."""
        return {}

    def supervisor_delete_target(self, node: Node) -> dict[str, Any] | None:
        """How the run's supervisor on the pod deletes this node (worker/supervisor.py reads it), or None
        when it cannot: plain data, since the supervisor imports nothing of the console."""
        return None

    def supervisor_address(self, node: Node, targets: list[SshTarget]) -> tuple[str, str]:
        """(the address the supervisor listens on, the one the workers reach it at): worker 0 on the
        pod's own network. Providers whose workers share this machine override it with loopback."""
        first = node.workers[0] if node.workers else None
        return "0.0.0.0", (first.internal_ip if first and first.internal_ip else targets[0].host)

    async def close(self) -> None:  # noqa: B027 - a provider with nothing to release keeps this
        """Release connections, servers and threads."""
