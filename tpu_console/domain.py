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


class QueueState(enum.StrEnum):
    """Mirrors `google.cloud.tpu_v2.QueuedResourceState.State`: a queued request for a node."""

    STATE_UNSPECIFIED = "STATE_UNSPECIFIED"
    CREATING = "CREATING"
    ACCEPTED = "ACCEPTED"
    WAITING_FOR_RESOURCES = "WAITING_FOR_RESOURCES"
    PROVISIONING = "PROVISIONING"
    ACTIVE = "ACTIVE"
    FAILED = "FAILED"
    SUSPENDING = "SUSPENDING"
    SUSPENDED = "SUSPENDED"
    DELETING = "DELETING"

    @property
    def waiting(self) -> bool:
        """Still queued for capacity: nothing has been provisioned yet."""
        return self in (QueueState.CREATING, QueueState.ACCEPTED, QueueState.WAITING_FOR_RESOURCES)

    @property
    def holds_quota(self) -> bool:
        """A failed or suspended request keeps its quota until it is deleted (like a PREEMPTED node)."""
        return self in (QueueState.FAILED, QueueState.SUSPENDED, QueueState.SUSPENDING)


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
    queued_request: str | None = None  # the queued request that made it (gcp), by name
    symptoms: tuple[str, ...] = ()  # what the TPU API reports wrong with it, one line each
    maintenance: Maintenance | None = None  # upcoming maintenance, where the provider reports it
    # Multislice: `slices` slices of accelerator_type joined over the data-center network; `shape` counts
    # the hosts and devices of all of them, slice by slice (worker w is in slice w // workers_per_slice).
    slices: int = 1
    # Each slice's own state, slice by slice (a gcp multislice: its nodes NAME-0, NAME-1 ...); () for one
    # slice. `state` is then the worst of them: a slice preempted alone makes the whole node unusable.
    slice_states: tuple[str, ...] = ()

    @property
    def accelerator_type(self) -> str:
        return self.shape.accelerator_type

    @property
    def workers_per_slice(self) -> int:
        return self.shape.workers // self.slices

    def slice_of(self, worker: int) -> int:
        return worker // self.workers_per_slice

    @property
    def ready_slices(self) -> tuple[int, ...]:
        """The slices that take work: all of a READY node; of a multislice some of whose slices are lost
        (the node reads the worst of them), those that read READY."""
        if self.state.is_usable:
            return tuple(range(self.slices))
        return tuple(i for i, s in enumerate(self.slice_states) if s == NodeState.READY)

    @property
    def slice_names(self) -> tuple[str, ...]:
        """The slices as the TPU API names a multislice's nodes (NAME-0, NAME-1, ...); () for one slice."""
        return tuple(f"{self.name}-{i}" for i in range(self.slices)) if self.slices > 1 else ()


@dataclass(frozen=True)
class Maintenance:
    """Maintenance the provider has announced for a node (the TPU API's `upcoming_maintenance`)."""

    kind: str  # SCHEDULED, UNSCHEDULED
    status: str  # PENDING, ONGOING
    starts_at: datetime | None = None
    ends_at: datetime | None = None

    def overlaps(self, start: datetime, end: datetime | None) -> bool:
        """Does the window touch [start, end) (end None: still going)? An unknown start counts as now."""
        begins = self.starts_at or start
        return (end is None or begins < end) and (self.ends_at is None or self.ends_at > start)


@dataclass(frozen=True)
class QueuedRequest:
    """A request for a node that waits for capacity (gcp queued resources); its name is the node's."""

    name: str
    provider: str
    state: QueueState
    zone: str | None = None
    accelerator_type: str = ""
    provisioning: str = "on-demand"  # spot, on-demand, reservation, best-effort
    created_at: datetime | None = None
    reason: str | None = None  # why it failed or was suspended
    has_node: bool = False  # its node exists (listed among the nodes)
    labels: dict[str, str] = field(default_factory=dict)  # its node's labels (who made it: gcp/labels.py)
    slices: int = 1  # Multislice: a request for this many slices (nodes NAME-0 .. NAME-<N-1>)


@dataclass(frozen=True)
class CreateRequest:
    """Everything `create` may be asked for; a provider ignores what does not apply to it."""

    name: str
    accelerator_type: str
    zones: tuple[str, ...] = ()
    spot: bool = True
    runtime_version: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    queued: bool = False  # a queued request that waits for capacity, where the provider and type allow
    reservation: str | None = None  # a reservation's name (or full path) to create in
    best_effort: bool = False  # the best-effort tier (gcp's v2alpha1 API)
    valid_for_s: float | None = None  # a queued request gives up after this long
    race: bool = False  # one queued request per zone at once; the first to become ACTIVE wins
    slices: int = 1  # Multislice: this many slices of accelerator_type, created and deleted as one node

    @property
    def provisioning(self) -> str:
        """How the capacity is paid for: reservation, best-effort, spot or on-demand."""
        if self.reservation:
            return "reservation"
        if self.best_effort:
            return "best-effort"
        return "spot" if self.spot else "on-demand"


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


def worker_slices(slices: int, workers: list[int]) -> dict[int, int]:
    """Each worker's slice in a run on `slices` slices (every host of every slice ran it, numbered slice by
    slice); {} for one slice."""
    if slices < 2 or not workers:
        return {}
    per_slice = max(1, (max(workers) + 1) // slices)
    return {w: w // per_slice for w in workers}
