"""A gcp multislice as one node: the TPU API makes N slices from one queued resource with a node count
(`multisliceParams {nodeCount, nodeIdPrefix}`), as nodes PREFIX-0 .. PREFIX-<N-1> that each name the
request. The console shows, launches on and deletes them as one `Node` named like the request: workers
numbered slice by slice, each slice's state in `slice_states`, the group's state the worst of them (a slice
preempted alone leaves the group unusable until it is recreated). No I/O.
"""

from __future__ import annotations

import dataclasses
import re

from tpu_console.domain import AcceleratorShape, Node, NodeState

# Slices in these states will not come back by waiting: the group must be deleted and created again.
DEAD = (NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.STOPPED, NodeState.HIDDEN, NodeState.UNKNOWN)
MISSING = "MISSING"  # a slice the request names that the listing does not show (gone, or not made yet)


def slice_ids(api_queued) -> tuple[str, ...]:
    """The node ids of a multislice request (`tpu_v2` multislice_params, or v2alpha1's multi_node_params),
    as the API names them; () for a request of one node."""
    specs = list(api_queued.tpu.node_spec)
    if not specs:
        return ()
    spec = specs[0]
    params = next((getattr(spec, f) for f in ("multislice_params", "multi_node_params")
                   if f in type(spec).meta.fields and f in spec), None)
    if params is None or params.node_count < 2:
        return ()
    prefix = params.node_id_prefix or api_queued.name.rsplit("/", 1)[-1]
    return tuple(f"{prefix}-{i}" for i in range(params.node_count))


def group_state(states: list[NodeState]) -> NodeState:
    """The worst slice's state: a dead slice first, then one not READY yet (CREATING ...), else READY."""
    for state in states:
        if state in DEAD:
            return state
    return next((s for s in states if s is not NodeState.READY), NodeState.READY)


def merge(name: str, slice_names: tuple[str, ...], found: dict[str, Node]) -> Node:
    """One node from the slices `found` (by node name) of the multislice `name` whose slices are
    `slice_names`, in order. A slice not found counts as MISSING and makes the group UNKNOWN."""
    present = [found[s] for s in slice_names if s in found]
    first = present[0]
    states = [found[s].state if s in found else None for s in slice_names]
    workers, index = [], 0
    for node in present:
        for worker in node.workers:
            workers.append(dataclasses.replace(worker, index=index))
            index += 1
    per_slice = first.shape
    shape = AcceleratorShape(per_slice.accelerator_type, per_slice.workers * len(slice_names),
                             per_slice.devices_per_worker, per_slice.chips * len(slice_names))
    reasons = [f"slice {i} ({s}): {found[s].state_reason}" for i, s in enumerate(slice_names)
               if s in found and found[s].state_reason and found[s].state is not NodeState.READY]
    unhealthy = next((n.health for n in present if n.health and n.health != "HEALTHY"), first.health)
    return dataclasses.replace(
        first,
        name=name,
        shape=shape,
        state=NodeState.UNKNOWN if None in states else group_state(states),  # type: ignore[arg-type]
        workers=tuple(workers),
        health=unhealthy,
        created_at=min((n.created_at for n in present if n.created_at), default=None),
        state_reason="; ".join(reasons) or None,
        symptoms=tuple(f"slice {i}: {symptom}" for i, s in enumerate(slice_names) if s in found
                       for symptom in found[s].symptoms),
        maintenance=next((n.maintenance for n in present if n.maintenance is not None), None),
        slices=len(slice_names),
        slice_states=tuple(str(state) if state is not None else MISSING for state in states),
    )


def group_listed(nodes: list[Node], requests: dict[tuple[str, str], tuple[str, ...]]) -> list[Node]:
    """Replace the slices of each multislice by one node. `requests`: (zone, request name) -> its slice
    names, from the queued-resource listing. Nodes that share a request without it (its listing failed)
    are grouped too, in the order of their names' slice numbers."""
    by_request: dict[tuple[str, str], list[Node]] = {}
    for node in nodes:
        if node.queued_request:
            by_request.setdefault((node.zone or "", node.queued_request), []).append(node)
    grouped: dict[tuple[str, str], Node] = {}
    for key, members in by_request.items():
        names = requests.get(key)
        if names is None:
            if len(members) < 2:
                continue
            names = tuple(sorted((n.name for n in members), key=slice_number))
        grouped[key] = merge(key[1], names, {n.name: n for n in members})
    result, placed = [], set()
    for node in nodes:
        key = (node.zone or "", node.queued_request or "")
        if key not in grouped:
            result.append(node)
        elif key not in placed:
            placed.add(key)
            result.append(grouped[key])
    return result


def slice_number(name: str) -> int:
    """`run-1` -> 1: where a slice's node goes in its group."""
    match = re.search(r"-(\d+)$", name)
    return int(match.group(1)) if match else 0


def slice_problem(node: Node) -> str | None:
    """`slice 1 (run-1) is PREEMPTED` for a multislice whose slices are not all READY; None otherwise."""
    bad = [(i, s) for i, s in enumerate(node.slice_states) if s != NodeState.READY]
    if node.slices < 2 or not bad:
        return None
    names = node.slice_names
    return ", ".join(f"slice {i} ({names[i]}) is {state}" for i, state in bad)


def recreate_hint(node: Node) -> str:
    """What to do with a multislice a slice of which is gone for good."""
    return (f"{slice_problem(node)}: the {node.slices} slices run as one program, so {node.name} cannot be "
            f"launched on until it is recreated: `tpu-console delete {node.name} --yes` (every slice and "
            "its request; they hold TPU quota until deleted), then create it again")
