"""Before touching workers: the node looked up and READY, and every needed worker connected.

Both `exec` and `launch` check this first, so a command never half-runs across a pod: if one worker cannot
be reached, nothing happens on any of them and the person gets one line naming the worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tpu_console.domain import Node, NodeState
from tpu_console.errors import UserError, one_line
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node


async def open_node(providers: dict[str, Provider], name: str,
                    slices: Sequence[int] | None = None) -> tuple[Provider, Node]:
    """The node and its provider, or UserError if it is unknown or not READY (with `slices`, of a
    multislice: those slices READY, whatever the others)."""
    provider, node = await find_node(providers, name)
    usable = node.state.is_usable or (slices is not None and bool(slices)
                                      and set(slices) <= set(node.ready_slices))
    if not usable:
        raise UserError(_not_ready(name, node))
    return provider, node


def _not_ready(name: str, node: Node) -> str:
    """Why a node cannot be used; on a multislice, which slice is down (the slices run only together)."""
    down = [f"slice {i} is {state}" for i, state in enumerate(node.slice_states) if state != NodeState.READY]
    if node.slices > 1 and down:
        return (f"node {name!r}: {', '.join(down)}; its {node.slices} slices run as one program, so "
                f"recreate it (`tpu-console delete {name} --yes`, then create it again), or wait if that "
                "slice is still coming up")
    return f"node {name!r} is {node.state}, not READY; wait for it or check `tpu-console ls`"


async def unreachable_workers(fleet: Fleet, workers: Sequence[int]) -> dict[int, str]:
    """Connect to every worker at once; the ones that failed, with a one-line reason each."""
    answers = await asyncio.gather(*(fleet.connection(w).get() for w in workers), return_exceptions=True)
    failed: dict[int, str] = {}
    for worker, answer in zip(workers, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer  # a cancellation or exit: not a worker's fault
            failed[worker] = one_line(answer)
    return failed


async def require_all_reachable(fleet: Fleet, node: str | Node, workers: Sequence[int], doing: str) -> None:
    """UserError naming the first unreachable worker; `doing` says what did not happen ("nothing was run").
    Given the Node, a multislice's worker is named with its slice, and not offered to be left out (its
    job runs on every host of every slice)."""
    failed = await unreachable_workers(fleet, workers)
    if failed:
        worker, reason = next(iter(failed.items()))
        others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        multislice = isinstance(node, Node) and node.slices > 1
        name = node.name if isinstance(node, Node) else node
        where = f"worker {worker} (slice {node.slice_of(worker)})" if multislice else f"worker {worker}"
        fix = (" (a multislice job needs every host of every slice)" if multislice
               else ", or leave the worker out with --worker")
        raise UserError(
            f"{where} of {name!r} is unreachable: {reason}{others}; {doing}: "
            f"check the node with `tpu-console ls`{fix}"
        )
