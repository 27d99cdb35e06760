"""The environment a job on a multislice node needs to join its slices: the `MEGASCALE_*` variables the TPU
runtime reads (slice id, slice count, slice 0's coordinator), where the platform does not set them itself.

On a Cloud TPU multislice (a queued resource with a node count) the runtime sets them; on local and ssh pods,
where the console also names the jax.distributed coordinator, the console sets them in the job's environment,
so they are in place before anything imports JAX.

A run on some of a node's slices (slices that shrink and grow: a slice lost, the run goes on on the others;
`launch(..., slices=...)`) gets every one of them rewritten, on any provider, so nothing of the node's N
slices remains: the slice count K, each slice's id among the K (0..K-1, in the node's order), the first
remaining host as coordinator, a fresh port; and `TPU_CONSOLE_NUM_SLICES`, the count a program is told.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import replace

from tpu_console.domain import Node
from tpu_console.errors import UserError

COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"
NUM_SLICES = "MEGASCALE_NUM_SLICES"
SLICE_ID = "MEGASCALE_SLICE_ID"
PORT = "MEGASCALE_PORT"
DEFAULT_PORT = 8080  # the port the TPU runtime's megascale service listens on unless told otherwise
SLICE_COUNT = "TPU_CONSOLE_NUM_SLICES"  # the slices a job runs on, for any program (docs/contract.md)


def megascale_env(node: Node, coordinator_host: str, worker: int, port: int = DEFAULT_PORT) -> dict[str, str]:
    """The MEGASCALE_* variables of `worker` (a pod-wide index) on `node`, and its slice count for any
    program; {} for a single slice."""
    if node.slices < 2:
        return {}
    return {
        COORDINATOR: coordinator_host,
        NUM_SLICES: str(node.slices),
        SLICE_ID: str(node.slice_of(worker)),
        PORT: str(port),
        SLICE_COUNT: str(node.slices),
    }


def slices_env(node: Node, slices: Sequence[int], coordinator_host: str, worker: int,
               port: int) -> dict[str, str]:
    """Every MEGASCALE_* variable of `worker` in a run on `slices` of `node` (its slice indices, in order),
    renumbered for those slices alone; set even for one slice, so none of the node's own values is left."""
    return {
        COORDINATOR: coordinator_host,
        NUM_SLICES: str(len(slices)),
        SLICE_ID: str(list(slices).index(node.slice_of(worker))),
        PORT: str(port),
        SLICE_COUNT: str(len(slices)),
    }


def workers_of_slices(node: Node, slices: Sequence[int]) -> list[int]:
    """Every host of the given slices, in order (workers are numbered slice by slice)."""
    per_slice = node.workers_per_slice
    return [s * per_slice + i for s in slices for i in range(per_slice)]


def check_slices(node: Node, slices: Sequence[int]) -> tuple[int, ...]:
    """The slices as given, checked against the node: UserError for none, a repeat, or one it lacks."""
    chosen = tuple(slices)
    if node.slices < 2:
        raise UserError(f"{node.name!r} is one slice; a run on some of its slices needs a multislice node")
    if not chosen or len(set(chosen)) != len(chosen) or list(chosen) != sorted(chosen):
        raise UserError(f"slices {list(chosen)}: give each slice once, in order, e.g. [0, 2]")
    if chosen[-1] >= node.slices or chosen[0] < 0:
        raise UserError(f"{node.name!r} has slices 0..{node.slices - 1}, not {list(chosen)}")
    return chosen


def on_slices(node: Node, slices: Sequence[int]) -> Node:
    """The node as a run on `slices` of it sees it: that many slices of its type (what the plan and the
    batch checks judge)."""
    count, per_slice = len(slices), node.workers_per_slice
    shape = replace(node.shape, workers=per_slice * count, chips=node.shape.chips // node.slices * count)
    states = tuple(node.slice_states[s] for s in slices) if node.slice_states else ()
    return replace(node, slices=count, shape=shape, slice_states=states)


def megascale_port(node: Node, coordinator_host: str) -> int:
    """The runtime's default port; on a local pod a free one, as for its jax.distributed coordinator: its
    hosts are all this machine, where several pods (and any program on 8080) may be at once."""
    if node.provider != "local":
        return DEFAULT_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((coordinator_host, 0))
        return sock.getsockname()[1]


def refuse_partial_multislice(node: Node, selected: list[int]) -> None:
    """A multislice job is one program over every host of every slice: a subset would hang at startup."""
    if node.slices > 1 and len(selected) < node.shape.workers:
        raise UserError(
            f"{node.name!r} is {node.slices} slices of {node.accelerator_type} ({node.shape.workers} hosts); "
            "a multislice job runs on every host of every slice; leave out --worker"
        )
