"""The ssh provider: nodes made elsewhere, listed in config.toml as `[[ssh.nodes]]`, reached over plain
SSH with the same fleet code as every other provider.

    [[ssh.nodes]]
    name = "lab-pod"
    hosts = ["10.0.0.5", "10.0.0.6:2222"]   # one per worker, worker 0 first
    user = "researcher"
    key = "~/.ssh/id_ed25519"
    known_hosts = "~/.ssh/known_hosts"
    accept_new = false                     # true: trust (and record) hosts not yet in known_hosts
    devices_per_worker = 4

The provider does not probe the hosts: a configured node is listed as READY, and a worker that cannot be
reached shows up as a per-worker error when the fleet talks to it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tpu_console.domain import AcceleratorShape, Node, NodeState, SshTarget, Worker
from tpu_console.errors import NotFound, UserError
from tpu_console.providers.base import NodeListing, Provider
from tpu_console.settings import Settings, SshNodeSettings

# Where the trainer's coordinator listens on worker 0: a port derived from the node name, so every
# launch on a node agrees on it without asking the host, spread over a range few services use.
COORDINATOR_PORT_BASE = 20000
COORDINATOR_PORT_SPAN = 10000


def parse_host(text: str) -> tuple[str, int]:
    """`host`, `host:port`, `[v6addr]:port` or a bare IPv6 address -> (host, port); UserError if malformed."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise UserError(f"ssh host {text!r} is malformed; write it as [address]:port")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""  # a name, IPv4, or bare IPv6 address
    if not host:
        raise UserError(f"ssh host {text!r} has no host name; write host or host:port")
    if not port_text:
        return host, 22
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UserError(f"ssh host {text!r} has an invalid port; use a number from 1 to 65535")
    return host, int(port_text)


class SshProvider(Provider):
    name = "ssh"

    def __init__(self, settings: Settings) -> None:
        self._nodes = {node.name: node for node in settings.ssh.nodes}

    async def list_nodes(self) -> NodeListing:
        listing = NodeListing()
        for config in self._nodes.values():
            try:
                listing.nodes.append(self._node(config))
            except UserError as exc:
                listing.problems.append(f"ssh node {config.name}: {exc}")
        return listing

    async def get(self, name: str) -> Node:
        return self._node(self._config(name))

    async def ssh_targets(self, node: Node) -> list[SshTarget]:
        config = self._config(node.name)
        key = Path(config.key).expanduser()
        if not key.is_file():
            raise UserError(
                f"ssh node {node.name}: key file {key} does not exist; set `key` in its [[ssh.nodes]] entry"
            )
        known_hosts = Path(config.known_hosts).expanduser()
        return [
            SshTarget(
                worker=worker.index,
                host=worker.host,
                port=worker.port,
                username=config.user,
                client_key=key,
                known_hosts_file=known_hosts,
                accept_new=config.accept_new,
            )
            for worker in node.workers
        ]

    def coordinator_env(self, node: Node, targets: list[SshTarget]) -> dict[str, str]:
        """The part shared by all workers. The launcher adds TRAINER_PROCESS_ID=<worker index> per worker."""
        digest = int.from_bytes(hashlib.sha256(node.name.encode()).digest()[:4], "big")
        port = COORDINATOR_PORT_BASE + digest % COORDINATOR_PORT_SPAN
        host = targets[0].host
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return {"TRAINER_COORDINATOR_ADDRESS": address, "TRAINER_NUM_PROCESSES": str(len(targets))}

    def _config(self, name: str) -> SshNodeSettings:
        if name not in self._nodes:
            known = ", ".join(self._nodes) or "none"
            raise NotFound(f"no ssh node named {name!r} (configured: {known}); add it under [[ssh.nodes]]")
        return self._nodes[name]

    @staticmethod
    def _node(config: SshNodeSettings) -> Node:
        addresses = [parse_host(text) for text in config.hosts]
        workers = len(addresses)
        shape = AcceleratorShape(
            accelerator_type=config.accelerator_type or f"ssh-{workers}x{config.devices_per_worker}",
            workers=workers,
            devices_per_worker=config.devices_per_worker,
            chips=workers * config.devices_per_worker,
        )
        return Node(
            name=config.name,
            provider="ssh",
            shape=shape,
            state=NodeState.READY,
            workers=tuple(Worker(index=i, host=host, port=port) for i, (host, port) in enumerate(addresses)),
            zone="ssh",
        )
