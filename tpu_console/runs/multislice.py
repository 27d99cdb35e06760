"""The environment a job on a multislice node needs to join its slices: the `MEGASCALE_*` variables the TPU
runtime reads (slice id, slice count, slice 0's coordinator), where the platform does not set them itself.

On a Cloud TPU multislice (a queued resource with a node count) the runtime sets them; on local and ssh pods,
where the console also names the jax.distributed coordinator, the console sets them in the job's environment,
so they are in place before anything imports JAX.
"""

from __future__ import annotations

import socket

from tpu_console.errors import UserError
from tpu_console.model import Node

COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"
NUM_SLICES = "MEGASCALE_NUM_SLICES"
SLICE_ID = "MEGASCALE_SLICE_ID"
PORT = "MEGASCALE_PORT"
DEFAULT_PORT = 8080  # the port the TPU runtime's megascale service listens on unless told otherwise


def megascale_env(node: Node, coordinator_host: str, worker: int, port: int = DEFAULT_PORT) -> dict[str, str]:
    """The MEGASCALE_* variables of `worker` (a pod-wide index) on `node`; {} for a single slice."""
    if node.slices < 2:
        return {}
    return {
        COORDINATOR: coordinator_host,
        NUM_SLICES: str(node.slices),
        SLICE_ID: str(node.slice_of(worker)),
        PORT: str(port),
    }


def megascale_port(node: Node, coordinator_host: str) -> int:
    """The runtime's default port; on a local pod a free one, as for its jax.distributed coordinator: its
    hosts are all this machine, where several pods (and any program on 8080) may be at once."""
    if node.provider != "local":
        return DEFAULT_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((coordinator_host, 0))
        return sock.getsockname()[1]


def worker_slices(slices: int, workers: list[int]) -> dict[int, int]:
    """Each worker's slice in a run on `slices` slices (every host of every slice ran it, numbered slice by
    slice); {} for one slice."""
    if slices < 2 or not workers:
        return {}
    per_slice = max(1, (max(workers) + 1) // slices)
    return {w: w // per_slice for w in workers}


def refuse_partial_multislice(node: Node, selected: list[int]) -> None:
    """A multislice job is one program over every host of every slice: a subset would hang at startup."""
    if node.slices > 1 and len(selected) < node.shape.workers:
        raise UserError(
            f"{node.name!r} is {node.slices} slices of {node.accelerator_type} ({node.shape.workers} hosts); "
            "a multislice job runs on every host of every slice; leave out --worker"
        )
