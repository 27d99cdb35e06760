"""What the cloud and the workers say about a managed run now, read so that a failure to read is never
taken for an answer: a node read that fails or takes longer than `timeout_s` is UNKNOWN (never "absent"),
and only the provider's own NotFound for the node's name means it is gone.

Each read is one look; the judgement over several looks (twice, some seconds apart) is judge.py's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from tpu_console.domain import Node, NodeState, QueuedRequest
from tpu_console.errors import NotFound, one_line
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.run_recipes import RUNS_DIR
from tpu_console.history import discovery
from tpu_console.history.store import RunStore
from tpu_console.observe import lookup
from tpu_console.observe.supervision import Decision
from tpu_console.providers.base import Provider

LOST_STATES = (NodeState.PREEMPTED, NodeState.TERMINATED)
FINAL_RUN_STATES = ("succeeded", "failed", "stopped")
SHUTDOWN_NOTICE_S = 30.0  # a VM's shutdown gives its processes this long (Compute Engine's preemption)


@dataclass(frozen=True)
class NodeReading:
    at: float
    node: Node | None = None  # present
    absent: bool = False  # the provider said there is no such node
    error: str | None = None  # the read failed or timed out: it says nothing

    @property
    def known(self) -> bool:
        return self.error is None

    @property
    def lost(self) -> str | None:
        """Why the node can no longer run the job (None: it can, or the read said nothing)."""
        if self.absent:
            return "vanished"
        if self.node is not None and self.node.state in LOST_STATES:
            return self.node.state.value.lower()
        return None


async def read_node(provider: Provider, name: str, timeout_s: float) -> NodeReading:
    at = time.time()
    try:
        node = await asyncio.wait_for(provider.get(name), timeout_s)
    except NotFound:
        return NodeReading(at, absent=True)
    except TimeoutError:
        return NodeReading(at, error=f"no answer in {timeout_s:g} s")
    except Exception as exc:  # noqa: BLE001 - whatever failed, the read says nothing about the node
        return NodeReading(at, error=one_line(exc))
    return NodeReading(at, node=node)


async def read_requests(provider: Provider, name: str, timeout_s: float) -> list[QueuedRequest] | None:
    """The queued requests called `name` (every zone), or None when they could not be listed."""
    try:
        listing = await asyncio.wait_for(provider.list_nodes(), timeout_s)
    except Exception:  # noqa: BLE001 - unknown, as a failed node read
        return None
    if listing.problems:
        return None  # a zone that could not be read may hold one
    return [r for r in listing.requests if r.name == name]


@dataclass(frozen=True)
class RunReading:
    at: float
    state: str | None = None  # the run's state (observe/lookup.py), None when it could not be read
    lost_workers: bool = False  # some worker unreachable, its job's fate unknown
    killed_unasked: bool = False  # every job ended by SIGKILL/SIGTERM and nobody asked for a stop
    stop_requested: bool = False
    last_step: int | None = None
    error: str | None = None
    # the run's supervisor passed on a preemption notice (or the VM's shutdown): when the VM is to stop
    preempted_by: float | None = None

    @property
    def ended(self) -> bool:
        return self.state in FINAL_RUN_STATES


async def read_run(providers: dict[str, Provider], run_id: str, timeout_s: float,
                   store: RunStore | None = None) -> RunReading:
    at = time.time()
    try:
        view = await asyncio.wait_for(lookup.run_status(providers, run_id, store), timeout_s)
    except Exception as exc:  # noqa: BLE001 - a run that cannot be read now is read again next pass
        return RunReading(at, error=one_line(exc))
    steps = [s.events.last_step.step for s in view.workers if s.events.last_step is not None]
    statuses = [w.exit_status for w in view.workers]
    stop_requested = view.record.stop_requested_at is not None
    preempted_by = None
    if view.state in FINAL_RUN_STATES and not stop_requested:
        # a job that caught the notice's SIGTERM and exited 0 reads "succeeded": its supervisor knows better
        try:
            said = await asyncio.wait_for(lookup.supervisor_decisions(providers, view.record), timeout_s)
        except Exception as exc:  # noqa: BLE001 - not known yet: read again next pass
            return RunReading(at, error=f"the supervisor's decisions: {one_line(exc)}")
        if said is None:
            return RunReading(at, error="the supervisor's decisions could not be read")
        preempted_by = preemption_deadline(said)
    return RunReading(
        at, state=view.state, lost_workers=any(w.state == "lost" for w in view.workers),
        killed_unasked=(bool(statuses) and all(s in (137, 143) for s in statuses) and not stop_requested),
        stop_requested=stop_requested, last_step=max(steps) if steps else None, preempted_by=preempted_by,
    )


def preemption_deadline(decisions: list[Decision]) -> float | None:
    """When the VM was to stop, by the run's supervisor (worker/supervisor.py): the deadline of the
    preemption notice it passed on, or, for a run it ended `preempted` on the VM's shutdown alone, that
    moment plus the notice's 30 s. None when it saw no preemption."""
    for decision in decisions:
        notice = decision.fields.get("notice")
        if decision.decision == "preemption-notice" and isinstance(notice, dict):
            deadline = notice.get("deadline")
            return float(deadline) if isinstance(deadline, int | float) else decision.t + SHUTDOWN_NOTICE_S
    ended = next((d for d in decisions if d.decision == "ended" and d.fields.get("outcome") == "preempted"),
                 None)
    return None if ended is None else ended.t + SHUTDOWN_NOTICE_S


@dataclass(frozen=True)
class StartMarks:
    """Where a relaunched run began: the step it resumed after, and when its first step was made."""

    resumed_step: int | None = None
    first_step: int | None = None
    first_step_at: float | None = None


async def read_start(provider: Provider, node: Node, run_id: str, timeout_s: float,
                     worker: int = 0) -> StartMarks:
    """The run's first step event and its `resumed_step` warning (the trainer's), from its first worker's
    events.jsonl (`worker`: 0, or the first host of the slices it runs on). resumed_step is the warning's,
    else the first step less one."""
    path = f"{RUNS_DIR}/{run_id}/events.jsonl"
    command = (f"grep -m1 '\"resumed_step\"' {path} 2>/dev/null; "
               f"grep -m1 '\"kind\": *\"step\"' {path} 2>/dev/null; true")
    try:
        async with Fleet(await provider.ssh_targets(node)) as fleet:
            (result,) = await asyncio.wait_for(fleet.run(command, [worker], timeout=timeout_s), timeout_s + 5)
    except Exception:  # noqa: BLE001 - not known yet; asked again next pass
        return StartMarks()
    resumed = first = at = None
    for line in result.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("resumed_step") is not None:
            resumed = int(event["resumed_step"])
        elif event.get("kind") == "step" and isinstance(event.get("step"), int):
            first, at = event["step"], event.get("t")
    if first is not None and resumed is None:
        resumed = first - 1
    return StartMarks(resumed, first, float(at) if isinstance(at, int | float) else None)


async def runs_since(providers: dict[str, Provider], node: str, since: float, store: RunStore) -> list[str]:
    """Runs on the node started at or after `since` that are not known to have ended, newest first: a
    launch the controller made but had not journaled when it was killed. Runs launched from elsewhere are
    added to the history first (history/discovery.py)."""
    try:
        await discovery.discover(providers, store, node)
    except Exception:  # noqa: BLE001 - the history alone is the answer a failed look gives
        pass
    return [r.run_id for r in store.list(node, 50)
            if not r.finished and r.started_at.timestamp() >= since - 1]
