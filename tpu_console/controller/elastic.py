"""Slices that shrink and grow: a managed run on a multislice node goes on on the slices left when some are
lost, at once, instead of waiting for the whole node to be made again, and grows back onto every slice
once they read READY again.

Pure decisions (tested with made-up nodes) and the one action they lead to:

- `elastic(job)`: whether the run may go on with fewer slices: the bundled trainer always (it keeps
  `rollout.batch_size`, so the global batch is the same, each device's share in more micro-batches, and it
  resumes from its checkpoint on any slice count); a command only when its job file says `elastic = true`
  (it is told its slice count, TPU_CONSOLE_NUM_SLICES, and must resume from its own checkpoint).
- `slices_left(node)`: the READY slices of a multislice some of whose slices read lost (PREEMPTED,
  TERMINATED), when at least one is left; None otherwise.
- `grown_back(node, on)`: every slice of the node READY while the run is on fewer (`on`): time to grow.
- `relaunch_on_slices(...)`: stop the run where it still runs (SIGTERM first: the trainer saves the last
  finished step before it ends, trainer/stop.py, so a grow costs at most the step under way), then launch
  the same job on `slices` alone (launch/start.py's `slices`: every MEGASCALE variable rewritten for them,
  the shape checks and the plan made for that many slices).

The loop (loop.py) calls them on each watch of a managed multislice run: `slices_left` before a node with a
lost slice is judged lost (a shrink instead of a recovery of the whole node, when the job is `elastic`),
`grown_back` while the run is on fewer slices than its node.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from tpu_console.controller import relaunch
from tpu_console.domain import Node, NodeState
from tpu_console.errors import UserError
from tpu_console.history.store import RunStore
from tpu_console.launch.start import LaunchResult
from tpu_console.launch.stop import stop
from tpu_console.providers.base import Progress, Provider, no_progress

LOST = (NodeState.PREEMPTED, NodeState.TERMINATED)
# A stop before a relaunch gives the trainer time to finish its step and save it (SIGKILL after this).
STOP_GRACE_S = 60.0


def elastic(job: dict[str, Any]) -> bool:
    """Whether a managed run's job (relaunch.job_of_trainer / job_of_command) may run on fewer slices."""
    if job.get("kind") == "trainer":
        return True
    return bool((job.get("spec") or {}).get("elastic"))


def slices_left(node: Node) -> tuple[int, ...] | None:
    """The READY slices of a multislice node some of whose slices are lost, if any is left."""
    if node.slices < 2 or len(node.slice_states) != node.slices:
        return None
    lost = [i for i, s in enumerate(node.slice_states) if s in LOST]
    ready = tuple(i for i, s in enumerate(node.slice_states) if s == NodeState.READY)
    if not lost or not ready or len(lost) + len(ready) != node.slices:
        return None  # nothing lost, nothing left, or a slice still on its way (creating, repairing)
    return ready


def grown_back(node: Node, on: Sequence[int]) -> bool:
    """Every slice of the node READY again while the run is on fewer of them."""
    if node.state is not NodeState.READY or len(on) >= node.slices:
        return False
    return not node.slice_states or all(s == NodeState.READY for s in node.slice_states)


async def relaunch_on_slices(providers: dict[str, Provider], managed_id: str, node: str, job: dict[str, Any],
                             slices: Sequence[int], running: str | None, *, webhook_url: str | None = None,
                             store: RunStore | None = None, progress: Progress = no_progress,
                             stop_grace_s: float = STOP_GRACE_S) -> LaunchResult:
    """Stop `running` (the run now on the node, if any) and launch the managed run's job on `slices`.
    Raises UserError when the job may not (a command without `elastic = true`) or the launch is refused."""
    if not elastic(job):
        raise UserError(f"managed run {managed_id} is a command without `elastic = true`: it runs on every "
                        "slice or not at all")
    if running is not None:
        with contextlib.suppress(UserError):  # ended already, or its hosts gone with their slice
            await stop(providers, running, store=store, grace_s=stop_grace_s)
    progress(f"{managed_id}: launching on slice(s) {', '.join(map(str, slices))} of {node}")
    return await relaunch.launch_again(providers, managed_id, node, job, webhook_url=webhook_url, store=store,
                                       progress=progress, slices=tuple(slices))
