"""Queued resources: building the API's `QueuedResource` for a create, and reading one back as the
console's `QueuedRequest`. No I/O."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from tpu_console.domain import CreateRequest, QueuedRequest, QueueState
from tpu_console.providers.gcp.multislice import slice_ids

_PATH = re.compile(r"^projects/(?P<project>[^/]+)/locations/(?P<zone>[^/]+)/queuedResources/(?P<name>[^/]+)$")

# The TPU families Google offers queued resources for, by the console's canonical type prefix.
QUEUED_FAMILIES = ("v5litepod-", "v5p-", "v6e-")


def supports_queued(accelerator_type: str) -> bool:
    return accelerator_type.startswith(QUEUED_FAMILIES)


def queued_path(project: str, zone: str, name: str) -> str:
    return f"projects/{project}/locations/{zone}/queuedResources/{name}"


def split_queued_path(path: str) -> tuple[str, str, str]:
    match = _PATH.match(path)
    if not match:
        raise ValueError(f"not a queued resource path: {path!r}")
    return match.group("project"), match.group("zone"), match.group("name")


def reservation_path(project: str, zone: str, reservation: str) -> str:
    """A bare reservation name is taken to live in the request's zone; a full path is kept."""
    if "/" in reservation:
        return reservation
    return f"projects/{project}/locations/{zone}/reservations/{reservation}"


def build_queued_resource(types, request: CreateRequest, project: str, zone: str, node):
    """The `QueuedResource` for `request` in `zone`, from `types` (tpu_v2, or tpu_v2alpha1 for best-effort),
    making `node` (a Node of the same module) named `request.name`."""
    from google.protobuf import duration_pb2

    spec = types.QueuedResource.Tpu.NodeSpec
    parent = f"projects/{project}/locations/{zone}"
    if request.slices > 1:
        # Multislice: a node count instead of a node id; the API names the nodes NAME-0 .. NAME-<N-1>.
        # v2alpha1 (best-effort) calls the same message multi_node_params.
        multislice = "multislice_params" in spec.meta.fields
        field, params = (("multislice_params", spec.MultisliceParams) if multislice
                         else ("multi_node_params", spec.MultiNodeParams))
        node_spec = spec(parent=parent, node=node,
                         **{field: params(node_count=request.slices, node_id_prefix=request.name)})
    else:
        node_spec = spec(parent=parent, node_id=request.name, node=node)
    fields = {"tpu": types.QueuedResource.Tpu(node_spec=[node_spec])}
    if request.reservation:
        fields["reservation_name"] = reservation_path(project, zone, request.reservation)
    elif request.best_effort:
        fields["best_effort"] = types.QueuedResource.BestEffort()
    elif request.spot:
        fields["spot"] = types.QueuedResource.Spot()
    # on-demand: no tier at all (the API's default)
    if request.valid_for_s:
        fields["queueing_policy"] = types.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=int(request.valid_for_s)))
    return types.QueuedResource(**fields)


def to_queued_request(api_queued) -> QueuedRequest:
    """Map a `tpu_v2.QueuedResource` (or v2alpha1's)."""
    _, zone, name = split_queued_path(api_queued.name)
    try:
        state = QueueState(api_queued.state.state.name)
    except ValueError:
        state = QueueState.STATE_UNSPECIFIED
    specs = list(api_queued.tpu.node_spec)
    accelerator_type = specs[0].node.accelerator_type if specs else ""
    slices = len(slice_ids(api_queued)) or 1
    return QueuedRequest(
        name=name,
        provider="gcp",
        state=state,
        zone=zone,
        accelerator_type=accelerator_type,
        provisioning=_provisioning(api_queued),
        created_at=_created_at(api_queued),
        reason=queued_reason(api_queued),
        labels=dict(specs[0].node.labels) if specs else {},
        slices=slices,
    )


def node_name_of(api_queued) -> str | None:
    """The name its node lists under: its node id, or for a multislice the request's own name (its
    slices list as one node of that name)."""
    specs = list(api_queued.tpu.node_spec)
    if slice_ids(api_queued) or (specs and not specs[0].node_id):  # no node id: a node count v2 hides
        return split_queued_path(api_queued.name)[2]
    return specs[0].node_id if specs else None


def queued_reason(api_queued) -> str | None:
    """Why a request failed, or who suspended it."""
    state = api_queued.state
    if state.state.name == "FAILED" and state.failed_data.error.message:
        return " ".join(state.failed_data.error.message.split())
    if state.state.name in ("SUSPENDING", "SUSPENDED"):
        initiator = state.state_initiator.name
        return {"SERVICE": "suspended by the service", "USER": "suspended by a user"}.get(initiator)
    return None


def _provisioning(api_queued) -> str:
    if api_queued.reservation_name:
        return "reservation"
    if "best_effort" in type(api_queued).meta.fields and "best_effort" in api_queued:
        return "best-effort"
    if "spot" in api_queued:
        return "spot"
    if "guaranteed" in api_queued:
        return "reservation" if getattr(api_queued.guaranteed, "reserved", False) else "on-demand"
    return "on-demand"


def _created_at(api_queued) -> datetime | None:
    created = api_queued.create_time
    if not created or created.timestamp() <= 0:
        return None
    return created if created.tzinfo else created.replace(tzinfo=UTC)
