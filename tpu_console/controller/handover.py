"""Handing a launched run to the controller: the managed run's record, made from the launch's result and
the job as launched (relaunch.py), added to the controller's store. The controller (a daemon, or `launch
--recover` in the foreground) takes it from there: incarnation 0 is the node and run just launched.

What the run needs from this machine goes where any controller finds it: a project synced from a folder
as a snapshot in the store (snapshot.py), the `.env` to the acting controller's own home over SSH when it
runs on another machine (`give_env`; never into the store). A local pod's run is refused while the acting
controller is of another console home, which cannot reach the pod (`refuse_unreachable_pod`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_console import pricing
from tpu_console.controller import env_copies, relaunch, snapshot
from tpu_console.controller import state as st
from tpu_console.controller.lease import read_lease
from tpu_console.controller.state import Action, Incarnation, ManagedRun
from tpu_console.controller.store import StateStore
from tpu_console.errors import UserError
from tpu_console.history import ownership
from tpu_console.launch.start import LaunchResult
from tpu_console.provision.project_sync import pack_project
from tpu_console.settings import Settings


@dataclass(frozen=True)
class Budgets:
    """What a managed run may spend on recoveries (a job file's `[recovery]`, launch's flags)."""

    max_recoveries: int = 3
    max_cost: float | None = None
    deadline: float | None = None  # epoch seconds
    lost_after_s: float = 600.0
    confirm_s: float = 5.0
    queued: bool = False
    valid_for_s: float | None = None
    doctor: bool | None = None  # the pod doctor on each new node; None: on, but for local pods


def hand_over(store: StateStore, result: LaunchResult, job: dict[str, Any], zones: list[str],
              budgets: Budgets = Budgets()) -> ManagedRun:
    """Add the launched run to the controller's store as a managed run; the record."""
    node = result.node
    project = relaunch.project_of(node.name, result.job) if job["kind"] == "command" else None
    if project is not None:
        try:
            project = snapshot.keep(store, project, job.get("env_file"))
        except UserError as exc:
            raise UserError(f"{exc}; {result.run_id} runs unmanaged: stop it (`tpu-console stop "
                            f"{node.name} {result.run_id}`), sync and launch again") from None
        if project.get("snapshot") and (job["spec"].get("project") or {}).get("dir"):
            # the job file's folder is this machine's: the snapshot, synced by prepare, stands for it
            job = {**job, "spec": {**job["spec"], "project": None}}
    estimate = pricing.price_per_hour(node)
    policy = job.get("policy") or {}
    price = policy.get("price_per_hour") or (estimate.per_hour if estimate is not None else None)
    run = ManagedRun(
        id=st.new_id(), provider=node.provider, node=node.name, accelerator_type=node.accelerator_type,
        job=job, zones=[z for z in zones if z], spot=node.spot, slices=node.slices,
        runtime_version=node.runtime_version if node.provider == "gcp" else None,
        queued=budgets.queued, valid_for_s=budgets.valid_for_s,
        project=project,
        setup=(result.job or {}).get("setup") if job["kind"] == "command" else None,
        max_recoveries=budgets.max_recoveries, max_cost=budgets.max_cost, price_per_hour=price,
        deadline=budgets.deadline, confirm_s=budgets.confirm_s, lost_after_s=budgets.lost_after_s,
        doctor=budgets.doctor if budgets.doctor is not None else node.provider != "local",
        owner=ownership.me(),
        incarnations=[Incarnation(0, node.name, node.zone,
                                  created_at=node.created_at.timestamp() if node.created_at else time.time(),
                                  run_id=result.run_id, started_at=time.time())],
        intent={"action": Action.WATCH.value, "n": 0, "at": time.time(), "by": "launch"},
    )
    st.add(store, run)
    return run


def budgets_of(recovery: Any = None, *, max_recoveries: int | None = None, max_cost: str | None = None,
               deadline: str | None = None, lost_after: str | None = None, queued: bool | None = None,
               doctor: bool | None = None, now: float | None = None) -> Budgets:
    """The budgets from a job file's `[recovery]` with launch's flags over it (None: not given); a
    one-line UserError naming the flag for a bad value."""
    from tpu_console.observe.supervision import parse_amount, parse_duration

    def pick(flag: Any, key: str, default: Any) -> Any:
        if flag is not None:
            return flag
        return getattr(recovery, key) if recovery is not None else default

    count = pick(max_recoveries, "max_recoveries", 3)
    if int(count) < 0:
        raise UserError(f"--max-recoveries {count} is negative; give a count such as 3")
    cost = pick(max_cost, "max_cost", None)
    wait = pick(deadline, "deadline", None)
    lost = pick(lost_after, "lost_after", "10m")
    return Budgets(
        max_recoveries=int(count),
        max_cost=parse_amount(cost, "--max-total-cost") if cost is not None else None,
        deadline=(time.time() if now is None else now) + parse_duration(str(wait), "--deadline")
        if wait is not None else None,
        lost_after_s=parse_duration(str(lost), "--lost-after"),
        queued=bool(pick(queued, "queued", False)),
        doctor=pick(doctor, "doctor", None),
    )


def refuse_unmanageable(policy: Any) -> None:
    """A managed run's node is the controller's to delete and make again: a supervisor that deletes it
    when the run ends, costs too much or hangs would fight it."""
    if policy.deletes:
        raise UserError("a managed run's node is recreated by the controller, and --on-end delete, "
                        "--max-cost and --max-hang delete it: use --max-total-cost and --deadline instead")


def acting_elsewhere(store: StateStore) -> dict[str, Any] | None:
    """The lease's holder when the acting controller is of another console home than this one (another
    machine's, or one started with `--on` on this machine); None when it is this home's, or none acts."""
    lease = read_lease(store)
    holder = (lease or {}).get("holder") or {}
    return holder if holder and not ownership.is_this_home(holder) else None


def refuse_unreachable_pod(store: StateStore, provider: str, node: str) -> None:
    """A local pod's workers are folders of this console's home: a controller of another home cannot
    recover its run. Refused before anything is launched."""
    holder = acting_elsewhere(store) if provider == "local" else None
    if holder is not None:
        where = holder.get("where") or holder.get("host")
        raise UserError(f"{node} is a local pod, whose folders only this console reaches, and the acting "
                        f"controller runs on {where}; stop it there and `tpu-console controller start` here, "
                        "or launch without --managed")


def refuse_unrecoverable(store: StateStore, provider: str, node: str, project_dir: Path | None,
                         env_file: str | None) -> None:
    """What no controller could recover, refused before anything is launched: a local pod's run while the
    acting controller is of another console home; a job file's project folder holding a `.env` (it would
    be copied into the store with the project's snapshot)."""
    refuse_unreachable_pod(store, provider, node)
    if project_dir is not None:
        snapshot.refuse_secrets(pack_project(project_dir), env_file)


async def give_env(store: StateStore, run: ManagedRun, settings: Settings) -> str | None:
    """The run's `.env` to the acting controller, when it runs on another machine this console started it
    on (remote.py keeps those hosts); a warning with the fix when it could not be given, else None."""
    from tpu_console.controller import remote

    holder = await asyncio.to_thread(acting_elsewhere, store) if run.job.get("env_file") else None
    if holder is None:
        return None
    where = str(holder.get("where"))
    host = remote.known_host(where, settings)
    problem = "this console did not start it" if host is None else await remote.give_env_files(host, [run])
    if problem is None:
        return None
    return (f"the acting controller ({where}) has no copy of {run.id}'s .env ({problem}); give it with "
            f"{env_copies.start_again(where)} from this console, or it will not recover the run")
