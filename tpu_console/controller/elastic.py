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
- `on_trial(run)`: the run's current incarnation is a grow that has made no step yet; should it fail
  (its launch refused or failed, or the run ending failed before its first step: a host of the remade
  slice that cannot join, the first collective timing out), the run goes back onto the slices it was on
  (`before_grow`) instead of ending FAILED, and `next_grow_at` says when it may try again: GROW_BACKOFF_S
  after the first failure, doubled after each next, and not at all after GROW_TRIES failures in a row
  (until a whole run makes a step again: a recovery of the whole node, or a grow that worked).
- `relaunch_on_slices(...)`: stop the run where it still runs (SIGTERM first: the trainer saves the last
  finished step before it ends, trainer/stop.py, so a grow costs at most the step under way), then launch
  the same job on `slices` alone (launch/start.py's `slices`: every MEGASCALE variable rewritten for them,
  the shape checks and the plan made for that many slices).

The loop (loop.py) calls them on each watch of a managed multislice run: `slices_left` before a node with a
lost slice is judged lost (a shrink instead of a recovery of the whole node, when the job is `elastic`),
`grown_back` and `next_grow_at` while the run is on fewer slices than its node, `on_trial` when a grown
run's launch or start fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tpu_console.controller import relaunch
from tpu_console.controller.state import Incarnation, ManagedRun
from tpu_console.domain import Node, NodeState
from tpu_console.errors import UserError
from tpu_console.history.store import RunStore
from tpu_console.launch.start import LaunchResult
from tpu_console.launch.stop import stop
from tpu_console.providers.base import Progress, Provider, no_progress

LOST = (NodeState.PREEMPTED, NodeState.TERMINATED)
# A stop before a relaunch gives the trainer time to finish its step and save it (SIGKILL after this).
STOP_GRACE_S = 60.0
GROW_FAILED = "grow failed"  # how a grown incarnation that failed its trial ended (its `ended`, then why)
GROW_TRIES = 3  # failed grows in a row before the run stays on fewer slices
GROW_BACKOFF_S = 300.0  # from the first failed grow to the next try; doubled after each next failure


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


def on_trial(run: ManagedRun) -> bool:
    """The current incarnation is a grow (onto more slices than the one before, no recovery's) that has
    made no step yet."""
    if len(run.incarnations) < 2 or run.current.first_step_at is not None:
        return False
    before, now = run.incarnations[-2], run.current
    grew = len(now.on_slices(run.slices)) > len(before.on_slices(run.slices))
    return grew and not any(r.n == now.n for r in run.recoveries)


def before_grow(run: ManagedRun) -> tuple[int, ...]:
    """The slices the run was on before its current incarnation (a grow on trial)."""
    return run.incarnations[-2].on_slices(run.slices)


def failed_grows(run: ManagedRun) -> list[Incarnation]:
    """The grows that failed since a run on every slice last made a step, in order."""
    failed: list[Incarnation] = []
    for inc in run.incarnations:
        if inc.slices is None and inc.first_step_at is not None:
            failed = []
        elif (inc.ended or "").startswith(GROW_FAILED):
            failed.append(inc)
    return failed


def next_grow_at(run: ManagedRun) -> float | None:
    """When the run on fewer slices may grow again (0.0: at once), None once GROW_TRIES grows in a row
    failed."""
    failed = failed_grows(run)
    if not failed:
        return 0.0
    if len(failed) >= GROW_TRIES:
        return None
    return (failed[-1].ended_at or 0.0) + GROW_BACKOFF_S * 2 ** (len(failed) - 1)


def grow_note(run: ManagedRun) -> str | None:
    """What the run's record says while failed grows hold it on fewer slices (None: none failed)."""
    failed = failed_grows(run)
    if not failed:
        return None
    on = len(run.current.on_slices(run.slices))
    last = (failed[-1].ended or GROW_FAILED)[len(GROW_FAILED) + 2:] or "?"
    then = next_grow_at(run)
    after = ("no more tries: it stays on them" if then is None else
             f"next try from {datetime.fromtimestamp(then, UTC):%Y-%m-%d %H:%M:%S} UTC")
    return (f"growing back to {run.slices} slices failed {len(failed)} of {GROW_TRIES} time(s), last: "
            f"{last}; on {on} of {run.slices} slices, {after}")


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
