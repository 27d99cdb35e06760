"""Handing a launched run to the controller: the managed run's record, made from the launch's result and
the job as launched (relaunch.py), added to the controller's store. The controller (a daemon, or `launch
--recover` in the foreground) takes it from there: incarnation 0 is the node and run just launched.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from tpu_console import pricing
from tpu_console.controller import relaunch
from tpu_console.controller import state as st
from tpu_console.controller.state import Action, Incarnation, ManagedRun
from tpu_console.controller.store import StateStore
from tpu_console.runs import ownership
from tpu_console.runs.launch import LaunchResult


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


def hand_over(store: StateStore, result: LaunchResult, job: dict[str, Any], zones: list[str],
              budgets: Budgets = Budgets()) -> ManagedRun:
    """Add the launched run to the controller's store as a managed run; the record."""
    node = result.node
    estimate = pricing.price_per_hour(node)
    policy = job.get("policy") or {}
    price = policy.get("price_per_hour") or (estimate.per_hour if estimate is not None else None)
    run = ManagedRun(
        id=st.new_id(), provider=node.provider, node=node.name, accelerator_type=node.accelerator_type,
        job=job, zones=[z for z in zones if z], spot=node.spot, slices=node.slices,
        runtime_version=node.runtime_version if node.provider == "gcp" else None,
        queued=budgets.queued, valid_for_s=budgets.valid_for_s,
        project=relaunch.project_of(node.name, result.job) if job["kind"] == "command" else None,
        setup=(result.job or {}).get("setup") if job["kind"] == "command" else None,
        max_recoveries=budgets.max_recoveries, max_cost=budgets.max_cost, price_per_hour=price,
        deadline=budgets.deadline, confirm_s=budgets.confirm_s, lost_after_s=budgets.lost_after_s,
        owner=ownership.me(),
        incarnations=[Incarnation(0, node.name, node.zone,
                                  created_at=node.created_at.timestamp() if node.created_at else time.time(),
                                  run_id=result.run_id, started_at=time.time())],
        intent={"action": Action.WATCH.value, "n": 0, "at": time.time(), "by": "launch"},
    )
    st.add(store, run)
    return run
