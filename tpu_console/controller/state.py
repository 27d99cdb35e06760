"""A managed run as the controller keeps it: one object `run-<id>` in the controller's store (store.py),
read and written whole, every write a compare-and-swap on the generation read, so that two controllers
(or a controller and a console cancelling the run) never overwrite each other's word.

It holds what is needed to bring the run back on a new node (the node's name, type, zones and spot setting;
the job as launched: the trainer's config or the command, the project and setup, every supervisor option),
its budgets, its status, every incarnation (a node and the run on it, from-to, how it ended), every
recovery and what its seconds were made of, and the journal: `intent`, the one action the controller is
about to take, written before the action is (loop.py replays it after a crash; each action is idempotent).
"""

from __future__ import annotations

import enum
import secrets
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from tpu_console.controller.store import Conflict, StateStore
from tpu_console.history.goodput import StepMark, Timeline

PREFIX = "run-"
MANAGED_LABEL = "tpu-console-managed"  # on every node the controller creates: the managed run's id
INCARNATION_LABEL = "tpu-console-incarnation"  # and which incarnation of it the node is


class Status(enum.StrEnum):
    RUNNING = "RUNNING"  # its run is live on its node, or being launched there
    RECOVERING = "RECOVERING"  # its node was lost: deleting, creating, preparing or relaunching
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # the job failed on a node that stayed READY: not retried
    STOPPED = "STOPPED"  # stopped or cancelled by someone
    GAVE_UP = "GAVE_UP"  # a budget ran out (recoveries, cost, deadline) or the node cannot be made

    @property
    def terminal(self) -> bool:
        return self not in (Status.RUNNING, Status.RECOVERING)


class Action(enum.StrEnum):
    """The journal's actions, in the order a recovery takes them."""

    LAUNCH = "launch"  # start the run on the current incarnation's node (adopt one already started)
    WATCH = "watch"  # look at the node and the run; decide
    DELETE = "delete"  # delete what is left of a lost node (and its queued requests)
    CREATE = "create"  # create the next incarnation's node (adopt one already made for it)
    PREPARE = "prepare"  # bootstrap, sync the same code, run the same setup
    SWEEP = "sweep"  # after the end: delete any node or queued request of the run that holds no live run


@dataclass
class Incarnation:
    n: int
    node: str
    zone: str | None = None
    created_at: float | None = None  # when its node read READY
    run_id: str | None = None
    started_at: float | None = None  # the run's launch
    first_step_at: float | None = None  # when the controller first saw a step of this run
    resumed_step: int | None = None  # the step the run resumed after (0: from the start)
    last_step: int | None = None
    last_step_at: float | None = None  # when the controller first saw last_step
    ended_at: float | None = None
    ended: str | None = None  # how: preempted, terminated, vanished, host lost, succeeded, failed, stopped
    slices: list[int] | None = None  # the slices of a multislice node its run is on (None: every slice)

    def on_slices(self, count: int) -> tuple[int, ...]:
        """The slices its run is on, of a node of `count` slices."""
        return tuple(self.slices) if self.slices is not None else tuple(range(count))


@dataclass
class Recovery:
    n: int  # the incarnation it made
    reason: str
    detected_at: float  # the first read that saw the loss
    confirmed_at: float | None = None  # the second, some seconds later
    deleted_at: float | None = None
    created_at: float | None = None  # the new node READY
    bootstrapped_at: float | None = None
    prepared_at: float | None = None  # bootstrapped, synced, set up
    checked_at: float | None = None  # the pod doctor found nothing (when it is on)
    started_at: float | None = None  # the run launched
    first_step_at: float | None = None
    last_step_before: int | None = None
    resumed_step: int | None = None
    zone: str | None = None

    @property
    def steps_lost(self) -> int | None:
        if self.last_step_before is None or self.resumed_step is None:
            return None
        return max(0, self.last_step_before - self.resumed_step)

    @property
    def seconds(self) -> float | None:
        """From the loss seen to the first step of the relaunched run."""
        return None if self.first_step_at is None else self.first_step_at - self.detected_at

    def parts(self) -> dict[str, float | None]:
        """What the seconds were made of: detect (to the confirming read), delete, create, bootstrap, sync
        (the code, the project and its setup), doctor (the pod doctor's check; 0 when it is off), start
        (the launch, the program's start, to its first step)."""
        marks = [self.detected_at, self.confirmed_at, self.deleted_at, self.created_at,
                 self.bootstrapped_at or self.created_at, self.prepared_at,
                 self.checked_at or self.prepared_at, self.first_step_at]
        names = ("detect", "delete", "create", "bootstrap", "sync", "doctor", "start")
        return {name: (b - a if a is not None and b is not None else None)
                for name, a, b in zip(names, marks, marks[1:], strict=False)}


@dataclass
class ManagedRun:
    id: str
    provider: str
    node: str
    accelerator_type: str
    job: dict[str, Any]  # how to launch it again: launch.job_from_state reads it
    zones: list[str] = field(default_factory=list)  # configured zones, raced after the node's own
    spot: bool = True
    slices: int = 1
    runtime_version: str | None = None
    queued: bool = False  # create through a queued request (gcp), racing the zones
    valid_for_s: float | None = None
    project: dict[str, Any] | None = None  # the code to sync again: {"dir" | "git", "branch", "digest"}
    setup: dict[str, Any] | None = None  # setup.json of the first run: command, requirements, python
    max_recoveries: int = 3
    max_cost: float | None = None  # over every incarnation, at price_per_hour
    price_per_hour: float | None = None
    deadline: float | None = None  # epoch seconds: no recovery begins after it
    confirm_s: float = 5.0  # two reads of a lost node at least this far apart before it is deleted
    lost_after_s: float = 600.0  # a run's workers unreachable this long on a READY node: the host is lost
    doctor: bool = True  # the pod doctor checks each new node before the relaunch (a finding: made again)
    status: str = Status.RUNNING.value
    incarnations: list[Incarnation] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    intent: dict[str, Any] | None = None  # {"action", "n", "at", "by"}: the journal's next action
    suspect: dict[str, Any] | None = None  # {"reason", "first_at", "reads"}: a loss seen, not confirmed yet
    lost_since: float | None = None  # the run's workers unreachable since
    killed_reads: int = 0  # reads of jobs killed by a signal nobody sent, on a node still READY
    stop_requested: bool = False
    sweep_until: float | None = None  # after the end, look for late-filled requests until then
    note: str | None = None  # why it ended, or what it waits for
    owner: dict[str, Any] = field(default_factory=dict)  # who handed it over (ownership.me())
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    heartbeat: dict[str, Any] | None = None  # the controller's last look: {"at", "by"}

    @property
    def state(self) -> Status:
        return Status(self.status)

    @property
    def current(self) -> Incarnation:
        return self.incarnations[-1]

    @property
    def labels(self) -> dict[str, str]:
        """The labels the next incarnation's node is created with: whose it is, and which incarnation."""
        return {MANAGED_LABEL: self.id, INCARNATION_LABEL: str(len(self.incarnations))}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["recoveries"] = [{**asdict(r), "steps_lost": r.steps_lost, "seconds": r.seconds,
                               "parts": r.parts()} for r in self.recoveries]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ManagedRun:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        inc_fields = {f.name for f in fields(Incarnation)}
        rec_fields = {f.name for f in fields(Recovery)}
        values["incarnations"] = [Incarnation(**{k: v for k, v in i.items() if k in inc_fields})
                                  for i in data.get("incarnations", [])]
        values["recoveries"] = [Recovery(**{k: v for k, v in r.items() if k in rec_fields})
                                for r in data.get("recoveries", [])]
        return cls(**values)

    def cost(self, now: float) -> float | None:
        """What its incarnations' nodes cost so far, at price_per_hour (None without a price)."""
        if self.price_per_hour is None:
            return None
        hours = sum(((i.ended_at or now) - i.created_at) / 3600 for i in self.incarnations
                    if i.created_at is not None)
        return hours * self.price_per_hour

    def budget_left(self, now: float) -> str | None:
        """Why no further recovery may begin (None: it may)."""
        if len(self.recoveries) >= self.max_recoveries:
            return f"{self.max_recoveries} recoveries already made"
        cost = self.cost(now)
        if self.max_cost is not None and cost is not None and cost >= self.max_cost:
            return f"its nodes cost ${cost:.2f} of the ${self.max_cost:g} allowed"
        if self.deadline is not None and now >= self.deadline:
            at = datetime.fromtimestamp(self.deadline, UTC).strftime("%Y-%m-%d %H:%M UTC")
            return f"its deadline {at} has passed"
        return None


def timeline(run: ManagedRun, now: float) -> Timeline:
    """The managed run's time as one run with a restart at each relaunch (history/goodput.py): the steps
    each incarnation made, spread evenly from its first step (the controller's reading of its events) to
    the last it saw, so that a preemption's cost (the steps done again, the time until the relaunch) is
    counted in its own bucket."""
    marks: list[StepMark] = []
    for inc in run.incarnations:
        if inc.first_step_at is None or inc.last_step is None:
            continue
        first = (inc.resumed_step or 0) + 1
        count = max(1, inc.last_step - first + 1)
        end = inc.last_step_at if inc.last_step_at is not None else inc.first_step_at
        every = (end - inc.first_step_at) / max(1, count - 1)
        marks += [StepMark(first + i, inc.first_step_at + i * every) for i in range(count)]
    relaunches = [i.started_at for i in run.incarnations[1:] if i.started_at is not None]
    first = run.incarnations[0]
    ended = run.current.ended_at if run.state.terminal else None
    launched = next((t for t in (first.started_at, first.created_at) if t is not None), run.created)
    return Timeline(launched_at=launched, steps=marks,
                    restarts=relaunches, recovered=relaunches, ended_at=ended, now=now)


def new_id() -> str:
    """A managed run's id: usable as a label value and an object name."""
    return f"m{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


@dataclass
class Stored:
    run: ManagedRun
    generation: int


def load(store: StateStore, run_id: str) -> Stored | None:
    data, generation = store.read(PREFIX + run_id)
    return None if data is None else Stored(ManagedRun.from_json(data), generation)


def save(store: StateStore, stored: Stored) -> None:
    """Write it back if nobody wrote it since it was read (Conflict otherwise); the generation moves on."""
    stored.run.updated = time.time()
    stored.generation = store.write(PREFIX + stored.run.id, stored.run.to_json(), stored.generation)


def add(store: StateStore, run: ManagedRun) -> Stored:
    """A new managed run (Conflict if its id is taken)."""
    stored = Stored(run, 0)
    save(store, stored)
    return stored


def all_runs(store: StateStore) -> list[Stored]:
    found = []
    for name in store.names():
        if name.startswith(PREFIX):
            try:
                stored = load(store, name[len(PREFIX):])
            except Conflict:
                continue
            if stored is not None:
                found.append(stored)
    return found


def request_cancel(store: StateStore, run_id: str, attempts: int = 10) -> ManagedRun | None:
    """Ask the controller to stop a managed run and delete what it made for it (it acts at its next pass):
    `stop_requested`, written back with the generation read, read again and asked again while the
    controller writes it meanwhile. None: no such run. An ended run is returned as it is."""
    for _ in range(attempts):
        stored = load(store, run_id)
        if stored is None or stored.run.state.terminal:
            return None if stored is None else stored.run
        stored.run.stop_requested = True
        try:
            save(store, stored)
        except Conflict:
            continue
        return stored.run
    raise Conflict(f"{run_id} was written {attempts} times while its cancel was asked; ask again")
