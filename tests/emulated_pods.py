"""Cloud TPU nodes whose workers are local pods: the TPU API emulator (tests/tpu_api_emulator.py) says what
the cloud says (zones, capacity, queued requests, preemption, labels), and a local pod of the same name is
the node's workers (real SSH servers and jobs on this machine). For the controller's chaos measure
(benchmarks/chaos.py) and its tests: a managed run of the real trainer recovered through the real gcp
provider's calls.

`EmulatedPods` is a provider named gcp: create makes the node in the emulator (its zones, its failures);
a READY node's local pod (`local_type`) is made the first time it is read, as a VM's hosts come with it;
get reads the emulator's node (state, zone, labels) with the pod's shape and workers; delete deletes both.
`preempt` (from the process that owns the emulator) preempts the
emulator's node and kills the pod's jobs without a word, as a spot VM's end does.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from tpu_console.domain import CreateRequest, Node, NodeState, QueuedRequest, SshTarget
from tpu_console.errors import NotFound, UserError
from tpu_console.providers.base import NodeListing, Progress, Provider, no_progress
from tpu_console.providers.gcp import GcpProvider
from tpu_console.providers.local import LocalProvider
from tpu_console.settings import load_settings

CLOUD_TYPE = "v6e-8"  # one host, queued resources allowed


class EmulatedPods(Provider):
    name = "gcp"

    def __init__(self, endpoint: str, project: str, zones: list[str], pods_root: Path,
                 poll_interval: float = 0.1, local_type: str = "local-1x1") -> None:
        self.local_type = local_type  # the pod a READY node's workers are, made with it
        settings = load_settings({"gcp": {"project": project, "zones": zones, "api_endpoint": endpoint}})
        self.cloud = GcpProvider(settings, poll_interval=poll_interval, create_timeout=600,
                                 delete_timeout=120, host_key_wait=0.2)
        self.pods = LocalProvider(root=pods_root)
        self._served: dict[str, Any] = {}  # the pod's creation time when this process started its servers

    def _merge(self, node: Node) -> Node:
        try:
            pod = self.pods.store.read(node.name)
        except NotFound:
            if node.state is not NodeState.READY:
                return node
            # a READY node has its hosts, whoever made it (a create killed half-way included)
            pod = self.pods.store.create(node.name, self.local_type, labels=dict(node.labels))
        pod = self.pods._with_ports(pod)
        return replace(node, shape=pod.shape, workers=pod.workers)

    async def list_nodes(self) -> NodeListing:
        listing = await self.cloud.list_nodes()
        listing.nodes = [self._merge(n) for n in listing.nodes]
        return listing

    async def get(self, name: str) -> Node:
        return self._merge(await self.cloud.get(name))

    async def create(self, request: CreateRequest, progress: Progress = no_progress) -> Node:
        self.local_type = request.accelerator_type
        with contextlib.suppress(NotFound):  # a pod left by a node deleted half-way: its disks go
            await self.pods.delete(request.name)
        node = await self.cloud.create(replace(request, accelerator_type=CLOUD_TYPE), progress)
        return self._merge(node)

    async def delete(self, name: str, progress: Progress = no_progress) -> None:
        try:
            await self.cloud.delete(name, progress)
        finally:
            with contextlib.suppress(NotFound):
                await self.pods.delete(name, progress)

    async def delete_queued(self, request: QueuedRequest, progress: Progress = no_progress) -> None:
        await self.cloud.delete_queued(request, progress)

    async def cancel_requests(self, requests: list[str], progress: Progress = no_progress) -> None:
        await self.cloud.cancel_requests(requests, progress)

    async def ssh_targets(self, node: Node) -> list[SshTarget]:
        if node.state is not NodeState.READY:
            raise UserError(f"{node.name} is {node.state.value}, not READY")
        pod = await self.pods.get(node.name)
        if self._served.get(node.name) != pod.created_at:
            # the pod was made again (by another controller process): this process's servers for the
            # old one answer with its host keys, so they go
            await self.pods._stop_servers(node.name)
            self._served[node.name] = pod.created_at
        return await self.pods.ssh_targets(pod)

    def coordinator_env(self, node: Node, targets: list[SshTarget]) -> dict[str, str]:
        return self.pods.coordinator_env(node, targets)

    def supervisor_address(self, node: Node, targets: list[SshTarget]) -> tuple[str, str]:
        return self.pods.supervisor_address(node, targets)

    async def close(self) -> None:
        await self.pods.close()
        await self.cloud.close()


def preempt(emulator: Any, zone: str, name: str, pods_root: Path) -> None:
    """The spot VM taken away: the emulator's node PREEMPTED and the pod's jobs killed (SIGKILL, no grace)."""
    emulator.preempt(zone, name)
    asyncio.run(LocalProvider(root=pods_root).preempt(name))
