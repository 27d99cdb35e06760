"""From the TPU API's `Node` message to the console's `model.Node`, and what a node's state means."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from tpu_console.domain import Maintenance, Node, NodeState, Worker
from tpu_console.providers.gcp import multislice
from tpu_console.providers.gcp.accelerators import shape_of_listed_node

_PATH = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)/nodes/(?P<name>[^/]+)$")


def node_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/nodes/{name}"


def split_node_path(path: str) -> tuple[str, str, str]:
    """`projects/p/locations/z/nodes/n` -> (p, z, n)."""
    match = _PATH.match(path)
    if not match:
        raise ValueError(f"not a TPU node path: {path!r}")
    return match.group("project"), match.group("zone"), match.group("name")


def to_model_node(api_node, *, internal_ip: bool = False, maintenance: Maintenance | None = None) -> Node:
    """Map a `google.cloud.tpu_v2.Node`. Workers are reached on their external IP unless `internal_ip`
    is set or the node has none (nodes created without external IPs). `maintenance` comes from the same
    node read through v2alpha1 (`maintenance_of`), the only version that reports it."""
    _, zone, name = split_node_path(api_node.name)
    workers = []
    for index, endpoint in enumerate(api_node.network_endpoints):
        external = endpoint.access_config.external_ip or None
        internal = endpoint.ip_address or None
        host = internal if internal_ip or not external else external
        workers.append(
            Worker(index=index, host=host or "", port=22, internal_ip=internal, external_ip=external)
        )
    state = _state(api_node)
    health = None if api_node.health.name == "HEALTH_UNSPECIFIED" else api_node.health.name
    scheduling = api_node.scheduling_config
    return Node(
        name=name,
        provider="gcp",
        shape=shape_of_listed_node(api_node.accelerator_type, len(api_node.network_endpoints)),
        state=state,
        workers=tuple(workers),
        zone=zone,
        health=health,
        spot=bool(scheduling.spot or scheduling.preemptible),
        runtime_version=api_node.runtime_version or None,
        created_at=_created_at(api_node),
        labels=dict(api_node.labels),
        state_reason=_state_reason(api_node, state),
        queued_request=api_node.queued_resource.rsplit("/", 1)[-1] if api_node.queued_resource else None,
        symptoms=tuple(_symptom(s) for s in api_node.symptoms),
        maintenance=maintenance,
    )


def maintenance_of(alpha_node) -> Maintenance | None:
    """A `tpu_v2alpha1.Node`'s `upcoming_maintenance`, or None when none is announced."""
    if "upcoming_maintenance" not in alpha_node:
        return None
    upcoming = alpha_node.upcoming_maintenance
    return Maintenance(
        kind=upcoming.type_.name if "type_" in upcoming else "UNKNOWN_TYPE",
        status=upcoming.maintenance_status.name if "maintenance_status" in upcoming else "UNKNOWN",
        starts_at=_rfc3339(upcoming.window_start_time),
        ends_at=_rfc3339(upcoming.window_end_time),
    )


def _symptom(symptom) -> str:
    kind = symptom.symptom_type.name
    worker = f" (worker {symptom.worker_id})" if symptom.worker_id else ""
    return f"{kind}{worker}" + (f": {symptom.details}" if symptom.details else "")


def _rfc3339(text: str) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def state_hint(node: Node) -> str | None:
    """What a person should know about a node's state, or None when there is nothing to say."""
    if node.slices > 1 and node.state in multislice.DEAD:
        return multislice.recreate_hint(node)
    if node.state is NodeState.PREEMPTED:
        return (
            f"{node.name} was preempted{_reason(node)}; it still holds TPU quota until deleted "
            f"(`tpu-console delete {node.name} --yes`), then create it again"
        )
    if node.state is NodeState.TERMINATED:
        return (
            f"{node.name} was terminated{_reason(node)}; it still holds TPU quota until deleted "
            f"(`tpu-console delete {node.name} --yes`)"
        )
    if node.state is NodeState.STOPPED:
        return f"{node.name} is stopped; it still holds TPU quota until deleted"
    if node.state in (
        NodeState.CREATING,
        NodeState.STARTING,
        NodeState.RESTARTING,
        NodeState.REPAIRING,
        NodeState.REIMAGING,
    ):
        return f"{node.name} is {node.state.value.lower()}; wait until it is READY"
    if node.state is NodeState.DELETING:
        return f"{node.name} is being deleted"
    if node.state is not NodeState.READY:
        return f"{node.name} is {node.state.value}{_reason(node)}"
    if node.health and node.health != "HEALTHY":
        return f"{node.name} is READY but reports health {node.health}{_reason(node)}"
    return None


def _reason(node: Node) -> str:
    return f" ({node.state_reason})" if node.state_reason else ""


def _state(api_node) -> NodeState:
    try:
        return NodeState(api_node.state.name)
    except ValueError:
        return NodeState.UNKNOWN


def _created_at(api_node) -> datetime | None:
    created = api_node.create_time  # DatetimeWithNanoseconds (aware) or None when unset
    if not created or created.timestamp() <= 0:
        return None
    return created if created.tzinfo else created.replace(tzinfo=UTC)


def _state_reason(api_node, state: NodeState) -> str | None:
    if api_node.health_description:
        return api_node.health_description
    details = [s.details for s in api_node.symptoms if s.details]
    if details:
        return "; ".join(details)
    if state is NodeState.PREEMPTED:
        return "spot capacity was reclaimed"
    return None
