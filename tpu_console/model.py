"""The domain model: plain dataclasses that every layer shares. No I/O here.

A *node* is what the TPU API calls a node (a TPU VM slice); it has one or more *workers* (hosts),
each with some accelerator devices. Providers produce nodes; the fleet layer talks to their workers.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path


class NodeState(enum.StrEnum):
    """Mirrors `google.cloud.tpu_v2.Node.State`, so a gcp node maps one-to-one."""

    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    CREATING = "CREATING"
    READY = "READY"
    RESTARTING = "RESTARTING"
    REIMAGING = "REIMAGING"
    DELETING = "DELETING"
    REPAIRING = "REPAIRING"
    STOPPED = "STOPPED"
    STOPPING = "STOPPING"
    STARTING = "STARTING"
    PREEMPTED = "PREEMPTED"
    TERMINATED = "TERMINATED"
    HIDING = "HIDING"
    HIDDEN = "HIDDEN"
    UNHIDING = "UNHIDING"
    UNKNOWN = "UNKNOWN"

    @property
    def is_usable(self) -> bool:
        """Only a READY node accepts SSH work."""
        return self is NodeState.READY

    @property
    def holds_quota(self) -> bool:
        """A preempted or terminated spot node still counts against quota until it is deleted."""
        return self in (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.STOPPED)


@dataclass(frozen=True)
class AcceleratorShape:
    """How a node's devices are laid out: `workers` hosts with `devices_per_worker` JAX devices each."""

    accelerator_type: str  # e.g. "v6e-16", "local-4x4"
    workers: int
    devices_per_worker: int
    chips: int  # billing unit; equals total devices except on megacore generations (v4, v5p)

    @property
    def total_devices(self) -> int:
        return self.workers * self.devices_per_worker


@dataclass(frozen=True)
class Worker:
    """One host of a node, as the fleet layer reaches it."""

    index: int
    host: str  # IP or hostname the console connects to
    port: int = 22
    internal_ip: str | None = None
    external_ip: str | None = None


@dataclass(frozen=True)
class Node:
    name: str
    provider: str  # "local", "gcp", "ssh"
    shape: AcceleratorShape
    state: NodeState
    workers: tuple[Worker, ...] = ()
    zone: str | None = None
    health: str | None = None
    spot: bool = False
    runtime_version: str | None = None
    created_at: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    state_reason: str | None = None  # e.g. why it was preempted or failed

    @property
    def accelerator_type(self) -> str:
        return self.shape.accelerator_type


@dataclass(frozen=True)
class CreateRequest:
    """Everything `create` may be asked for; a provider ignores what does not apply to it."""

    name: str
    accelerator_type: str
    zones: tuple[str, ...] = ()
    spot: bool = True
    runtime_version: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


_NODE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def validate_node_name(name: str) -> str | None:
    """Return why `name` is not a valid node name (the TPU API's rule), or None if it is."""
    if _NODE_NAME.match(name):
        return None
    return (
        f"invalid node name {name!r}: use 1-63 lowercase letters, digits and hyphens, "
        "starting with a letter and not ending with a hyphen"
    )


@dataclass(frozen=True)
class SshTarget:
    """How to reach one worker over SSH. Providers produce these; the fleet layer consumes them."""

    worker: int  # the worker's index within its node
    host: str
    port: int
    username: str
    client_key: Path  # the private key the console authenticates with
    # Host-key trust: pinned public keys (OpenSSH one-line format) when the provider knows them
    # (local pods, gcp guest attributes); otherwise an OpenSSH known_hosts file.
    host_keys: tuple[str, ...] = ()
    known_hosts_file: Path | None = None
    accept_new: bool = False  # with known_hosts_file: trust and record a host that is not listed yet

    @property
    def address(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"
