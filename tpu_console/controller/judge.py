"""The controller's judgement over what it reads (observe.py), pure: no I/O, so every rule is tested with
made-up readings.

- A node is lost (PREEMPTED, TERMINATED, or absent: the provider said NotFound) only when two reads at least
  `confirm_s` apart both say so; a read that failed or timed out says nothing, neither confirming nor
  clearing a suspicion; a read of a usable node clears it.
- A host is lost when the run's workers stayed unreachable for `lost_after_s` on a node that reads READY.
- A run that ended on a READY node ends the managed run (succeeded, failed, stopped), but for jobs all
  killed by a signal nobody sent: a spot VM's shutdown and a local pod's preemption end the jobs before the
  provider reports the node lost, so that end is looked at KILLED_READS more times first.
- A run whose supervisor passed on a preemption notice did not finish, whatever its jobs' exit statuses (a
  program that catches the notice's SIGTERM, checkpoints and exits 0 reads "succeeded"): the node is
  expected to read lost once the VM stops; should it still read READY `NOTICE_GRACE_S` after the notice's
  deadline (a maintenance the VM lived through), the run is relaunched on it (`in_place`).
- Ownership: a node is touched only if it is this managed run's, of its current incarnation or older
  (its labels; the first incarnation, made by hand, by its creation time) and nobody else's.

Slices that shrink and grow (elastic.py): a multislice node some of whose slices are lost reads lost as a
whole (its state is the worst of its slices'), but a run that may go on on the others (`elastic`) is judged
`shrink` onto the slices left, once two reads some seconds apart say so, and `grow` onto every slice once
all read READY again, the run on fewer has made a step and no failed grow holds it back
(elastic.next_grow_at). A grown run that ends failed before its first step is judged `back`: onto the
slices it was on, not the end of the managed run. A run on fewer slices is read, and judged, on its own
slices alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpu_console.controller.elastic import (
    before_grow,
    elastic,
    grown_back,
    next_grow_at,
    on_trial,
    slices_left,
)
from tpu_console.controller.observe import NodeReading, RunReading
from tpu_console.controller.state import INCARNATION_LABEL, MANAGED_LABEL, ManagedRun, Status
from tpu_console.domain import Node

KILLED_READS = 5
NOTICE_GRACE_S = 60.0  # past the notice's deadline, a node still READY is taken to have stayed


@dataclass(frozen=True)
class Verdict:
    action: str  # wait | recover | end | shrink | grow | back (a grow that failed: onto the slices before)
    reason: str | None = None
    status: Status | None = None  # the end's
    in_place: bool = False  # recover on the same node, which stayed READY: no delete, no create
    slices: tuple[int, ...] = ()  # shrink, grow, back: the slices to run on


WAIT = Verdict("wait")


def judge(run: ManagedRun, node: NodeReading, reading: RunReading | None) -> Verdict:
    """What to do after one look at the node and (when it is usable) the run; updates the run's
    suspicion, `lost_since` and `killed_reads`, which the caller saves."""
    if not node.known:
        return WAIT
    resized = _resize(run, node)
    if resized is not None:
        return resized
    lost = node.lost
    if lost is not None and not usable(run, node):
        return _confirm(run, lost, node.at)
    run.suspect = None
    if not usable(run, node) or reading is None:
        return WAIT
    if reading.error is not None or reading.state is None:
        return WAIT
    if reading.ended:
        if reading.stop_requested or reading.state == "stopped":
            return Verdict("end", "stopped", Status.STOPPED)
        if reading.preempted_by is not None:
            if reading.at < reading.preempted_by + NOTICE_GRACE_S:
                return WAIT  # the VM is going: the node reads lost soon
            return Verdict("recover", "preempted (notice; the node stayed READY)", in_place=True)
        if reading.state == "succeeded":
            return Verdict("end", "succeeded", Status.SUCCEEDED)
        if reading.killed_unasked and run.killed_reads < KILLED_READS:
            run.killed_reads += 1  # the provider may not have noticed the preemption yet: look again
            return WAIT
        if on_trial(run):
            on = len(run.current.on_slices(run.slices))
            return Verdict("back", f"the run on {on} slices failed before its first step",
                           slices=before_grow(run))
        return Verdict("end", "failed", Status.FAILED)
    run.killed_reads = 0
    if reading.lost_workers:
        run.lost_since = run.lost_since or reading.at
        if reading.at - run.lost_since >= run.lost_after_s:
            return Verdict("recover", "host lost")
        return WAIT
    run.lost_since = None
    return WAIT


def usable(run: ManagedRun, node: NodeReading) -> bool:
    """Whether the node can hold the run now: READY, or (a run on some slices of a multislice) those
    slices READY."""
    if node.node is None:
        return False
    on = run.current.on_slices(run.slices) if run.incarnations else tuple(range(run.slices))
    return set(on) <= set(node.node.ready_slices)


def _resize(run: ManagedRun, node: NodeReading) -> Verdict | None:
    """Shrink onto the slices left, or grow back onto all; None when neither is due."""
    if node.node is None or run.slices < 2 or not run.incarnations or not elastic(run.job):
        return None
    on = run.current.on_slices(run.slices)
    left = slices_left(node.node)
    if left is not None and not set(on) <= set(left):
        gone = [i for i in on if i not in left]
        states = ", ".join(f"slice {i} {node.node.slice_states[i].lower()}" for i in gone)
        return _confirm(run, states, node.at, Verdict("shrink", states, slices=left))
    due = next_grow_at(run)
    if (left is None and run.current.first_step_at is not None and grown_back(node.node, on)
            and due is not None and node.at >= due):
        run.suspect = None
        return Verdict("grow", f"every slice READY again: from {len(on)} to {run.slices}",
                       slices=tuple(range(run.slices)))
    return None


def _confirm(run: ManagedRun, reason: str, at: float, then: Verdict | None = None) -> Verdict:
    """`then` (a recovery for `reason`, by default) once two reads `confirm_s` apart said `reason`."""
    suspect = run.suspect
    if suspect is None or suspect.get("reason") != reason:
        run.suspect = {"reason": reason, "first_at": at, "reads": 1}
        return WAIT
    suspect["reads"] = int(suspect.get("reads", 1)) + 1
    if at - float(suspect["first_at"]) >= run.confirm_s:
        return then or Verdict("recover", reason)
    return WAIT


def not_ours(run: ManagedRun, node: Node, incarnation: int) -> str | None:
    """Why `node` (by the run's node name) must not be touched as incarnation `incarnation` of `run`, or
    None when it may: another managed run's node, a newer incarnation's, or someone else's."""
    managed = node.labels.get(MANAGED_LABEL)
    if managed is not None and managed != run.id:
        return f"{node.name} belongs to managed run {managed}"
    if managed is not None:
        try:
            its = int(node.labels.get(INCARNATION_LABEL, "0"))
        except ValueError:
            return f"{node.name} has an unreadable {INCARNATION_LABEL} label"
        if its > incarnation:
            return f"{node.name} holds incarnation {its}, newer than {incarnation}"
        return None
    first = run.incarnations[0] if run.incarnations else None
    made = node.created_at.timestamp() if node.created_at else None
    if first is None or first.created_at is None or made is None:
        return f"{node.name} carries no {MANAGED_LABEL} label of this run"
    if abs(made - first.created_at) > 0.001:  # the first incarnation, made by hand: by its creation time
        return f"{node.name} was made by someone else (created at another time than the run's)"
    return None
