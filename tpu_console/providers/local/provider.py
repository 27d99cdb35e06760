"""The local provider: simulated pods on this machine, the default when no GCP project is configured.

Nodes persist on disk (see store.py). The SSH servers that make the workers reachable live in this
process and start on demand, the first time `ssh_targets` is asked for a node; `close()` stops them.
Jobs the workers detached keep running after that, and a later console finds them by their files.
"""

from __future__ import annotations

import asyncio
import getpass
import socket
from dataclasses import replace
from pathlib import Path
from typing import Any

from tpu_console import locations, ssh_identity
from tpu_console.domain import CreateRequest, Node, NodeState, SshTarget, Worker, validate_node_name
from tpu_console.errors import UserError
from tpu_console.providers.base import NodeListing, Progress, Provider, no_progress
from tpu_console.providers.local import remove_pod
from tpu_console.providers.local.jobs import running_job_groups, stop_groups
from tpu_console.providers.local.shapes import parse_local_type
from tpu_console.providers.local.store import LOOPBACK, PodStore
from tpu_console.providers.local.worker_server import WorkerServer, WorkerSpec
from tpu_console.settings import Settings


class LocalProvider(Provider):
    name = "local"

    def __init__(self, settings: Settings | None = None, root: Path | None = None) -> None:
        self.settings = settings
        self.store = PodStore(root or locations.local_pods_dir())
        self._servers: dict[str, list[WorkerServer]] = {}
        self._starting: dict[str, asyncio.Lock] = {}

    async def list_nodes(self) -> NodeListing:
        listing = NodeListing()
        for name in self.store.names():
            try:
                listing.nodes.append(self._with_ports(self.store.read(name)))
            except (OSError, ValueError, KeyError) as exc:
                listing.problems.append(f"local node {name}: unreadable node.json ({exc})")
        return listing

    async def get(self, name: str) -> Node:
        return self._with_ports(self.store.read(name))

    async def create(self, request: CreateRequest, progress: Progress = no_progress) -> Node:
        if problem := validate_node_name(request.name):
            raise UserError(problem)
        shape = parse_local_type(request.accelerator_type)
        slices = f"{request.slices} slices x " if request.slices > 1 else ""
        progress(f"{request.name}: creating {slices}{shape.workers} local worker(s) x "
                 f"{shape.devices_per_worker} devices")
        node = await asyncio.to_thread(self.store.create, request.name, request.accelerator_type,
                                       request.slices, request.labels)
        progress(f"{request.name}: ready at {self.store.node_dir(request.name)}")
        return node

    async def delete(self, name: str, progress: Progress = no_progress) -> None:
        self.store.read(name)  # NotFound before anything changes
        await self._stop_servers(name)
        groups = remove_pod.job_groups(self.store, name)
        if groups:
            progress(f"{name}: stopping {len(groups)} running job(s)")
            await asyncio.to_thread(stop_groups, groups)
        aside = await asyncio.to_thread(self.store.remove, name)
        progress(f"{name}: deleted; its files are being removed in the background ({aside})")

    async def preempt(self, name: str, slice_index: int | None = None) -> None:
        """Rehearse a spot preemption: the workers vanish (servers stopped, jobs killed without a word, as
        when the VM is taken away) and the node reads PREEMPTED until it is deleted. With `slice_index`,
        of a multislice: that slice alone (its hosts' servers stopped and jobs killed; it reads PREEMPTED,
        the node the worst of its slices) until `recreate_slice`."""
        node = self.store.read(name)
        if slice_index is None:
            self.store.set_state(name, NodeState.PREEMPTED)
            await self._stop_servers(name)
            groups = remove_pod.job_groups(self.store, name)
        else:
            if not 0 <= slice_index < node.slices or node.slices < 2:
                raise UserError(f"{name} has slices 0..{node.slices - 1}, not {slice_index}")
            self.store.set_slice_state(name, slice_index, NodeState.PREEMPTED)
            hosts = [w for w in range(node.shape.workers) if node.slice_of(w) == slice_index]
            for server in [s for s in self._servers.get(name, []) if s.spec.index in hosts]:
                await server.close()
            groups = [g for w in hosts for g in running_job_groups(self.store.worker_dir(name, w))]
        await asyncio.to_thread(stop_groups, groups, 0.0)

    async def recreate_slice(self, name: str, index: int, progress: Progress = no_progress) -> None:
        """A lost slice made again: READY, its hosts' servers up again where they run, each on a port of its
        own again (a remade slice's hosts have new addresses; its old ports, in the ephemeral range, may
        have gone to another program's connection meanwhile)."""
        node = self.store.read(name)
        if index >= len(node.slice_states) or node.slice_states[index] == NodeState.READY:
            return  # not lost
        progress(f"{name}: making slice {index} again")
        for server in self._servers.get(name, []):
            if node.slice_of(server.spec.index) == index:
                await server.start()
        self.store.set_slice_state(name, index, NodeState.READY)

    async def ssh_targets(self, node: Node) -> list[SshTarget]:
        if not node.ready_slices:  # a multislice with a slice lost: the others are still reached
            raise UserError(
                f"local node {node.name} is {node.state.value}, not READY; delete and create it again"
            )
        servers = await self._ensure_servers(node)
        return self.targets_at(node, [server.port for server in servers])

    def targets_at(self, node: Node, ports: list[int]) -> list[SshTarget]:
        """SSH targets for a node whose workers listen on `ports` (worker order), each pinned to the
        worker's own host key: for servers run here or by a pod_host process."""
        client_key = ssh_identity.client_key_path()
        user = _user()
        return [
            SshTarget(
                worker=index,
                host=LOOPBACK,
                port=port,
                username=user,
                client_key=client_key,
                host_keys=(self.store.host_public_key(node.name, index),),
            )
            for index, port in enumerate(ports)
        ]

    def coordinator_env(self, node: Node, targets: list[SshTarget]) -> dict[str, str]:
        """The part shared by all workers. The launcher adds TRAINER_PROCESS_ID=<worker index> per worker."""
        return {
            "TRAINER_COORDINATOR_ADDRESS": f"{targets[0].host}:{_free_port(targets[0].host)}",
            "TRAINER_NUM_PROCESSES": str(len(targets)),
        }

    def supervisor_delete_target(self, node: Node) -> dict[str, Any] | None:
        """The supervisor deletes a local pod by running remove_pod.py's command (the layout and the kill
        logic live there only); `node_dir` tells it the pod is gone once that folder is."""
        return {"kind": "local", "node_dir": str(self.store.node_dir(node.name).resolve()),
                "command": remove_pod.command(self.store.root.resolve(), node.name)}

    def supervisor_address(self, node: Node, targets: list[SshTarget]) -> tuple[str, str]:
        return LOOPBACK, LOOPBACK  # every worker of a local pod is this machine

    def worker_server(self, name: str, worker: int) -> WorkerServer:
        """The running SSH server of one worker (after `ssh_targets`): stopping and starting it again
        on its port rehearses a worker that goes down and comes back."""
        return self._servers[name][worker]

    async def close(self) -> None:
        for name in list(self._servers):
            await self._stop_servers(name)

    async def _ensure_servers(self, node: Node) -> list[WorkerServer]:
        lock = self._starting.setdefault(node.name, asyncio.Lock())
        async with lock:  # two callers asking at once must not start two sets of servers
            if node.name in self._servers:
                return self._servers[node.name]
            authorized = ssh_identity.public_key_line()
            servers = [
                WorkerServer(
                    WorkerSpec(
                        index=i,
                        count=node.shape.workers,
                        devices=node.shape.devices_per_worker,
                        home=self.store.worker_dir(node.name, i),
                        host_key=self.store.host_private_key(node.name, i),
                    ),
                    authorized,
                )
                for i in range(node.shape.workers)
            ]
            await asyncio.gather(*(server.start() for server in servers))
            self._servers[node.name] = servers
            return servers

    async def _stop_servers(self, name: str) -> None:
        for server in self._servers.pop(name, []):
            await server.close()

    def _with_ports(self, node: Node) -> Node:
        servers = self._servers.get(node.name)
        if not servers:
            return node
        return replace(node, workers=tuple(Worker(s.spec.index, LOOPBACK, s.port) for s in servers))


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _user() -> str:
    try:
        return getpass.getuser()
    except OSError:
        return "worker"
