"""`tpu-console controller start | status | logs | stop | cancel`: the daemon that brings managed runs back
(controller/daemon.py), and what it did, read from the controller's store (docs/managed-runs.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.controller import daemon
from tpu_console.controller import state as st
from tpu_console.controller.lease import read_lease
from tpu_console.controller.state import ManagedRun
from tpu_console.controller.store import Conflict, open_store
from tpu_console.errors import UserError
from tpu_console.history.goodput import goodput
from tpu_console.providers.base import Provider
from tpu_console.settings import Settings
from tpu_console.views.nodes import format_table


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    controller = verbs.add_parser(
        "controller", help="the daemon that brings managed runs back after preemptions",
        description="One controller serves every managed run of a project (launch --managed, a job file's "
        "[recovery]): it recreates a lost node, bootstraps, syncs and relaunches the run, which resumes from "
        "its own checkpoint. Its state is beside the run records ([gcp] bucket, or this home's folder).",
    )
    sub = controller.add_subparsers(dest="controller_verb", metavar="start|status|logs|stop|cancel",
                                    required=True)
    start = sub.add_parser("start", parents=[common], help="start the daemon on this machine",
                           description="A systemd user service where `systemctl --user` works, else a "
                           "detached process; says which, and whether it survives a reboot.")
    start.add_argument("--detached", action="store_true",
                       help="a detached process even where systemd user services work")
    sub.add_parser("status", parents=[common], help="the daemon, its last heartbeat, every managed run")
    logs = sub.add_parser("logs", parents=[common], help="the daemon's log")
    logs.add_argument("--lines", "-n", type=int, default=50, metavar="N", help="the last N lines (50)")
    sub.add_parser("stop", parents=[common], help="stop the daemon here (its lease given back)")
    cancel = sub.add_parser("cancel", parents=[common], help="stop a managed run and what was made for it",
                            description="The run is stopped, and every node and queued request the "
                            "controller made for it deleted (a request filled later too).")
    cancel.add_argument("managed_id", metavar="MANAGED_ID")
    flags.add_yes(cancel, "cancel without asking")


async def controller(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    verb = args.controller_verb
    if verb == "start":
        started = await asyncio.to_thread(daemon.start, False if args.detached else None)
        if args.json:
            output.print_json({"kind": started.kind, "detail": started.detail,
                               "survives_reboot": started.survives_reboot, "log": str(daemon.log_file())})
        else:
            print(f"controller running as {started.why}; log: {daemon.log_file()}")
        return 0
    if verb == "stop":
        stopped = await asyncio.to_thread(daemon.stop)
        print("no controller runs here" if stopped is None else f"stopped the controller ({stopped.why})",
              file=sys.stderr)
        return 0
    if verb == "logs":
        print("\n".join(daemon.logs(args.lines)) or f"no log yet at {daemon.log_file()}")
        return 0
    store = open_store(settings)
    if verb == "cancel":
        return await asyncio.to_thread(_cancel, store, args.managed_id, args.yes, args.json)
    here = await asyncio.to_thread(daemon.status)
    lease = await asyncio.to_thread(read_lease, store)
    runs = [s.run for s in await asyncio.to_thread(st.all_runs, store)]
    if args.json:
        output.print_json({"here": None if here is None else {"kind": here.kind, "detail": here.detail},
                           "lease": lease, "store": store.place, "runs": [r.to_json() for r in runs]})
        return 0
    print(f"this machine: {here.why if here else 'no controller runs here'}")
    print(f"acting controller: {describe_lease(lease)}; state in {store.place}")
    if runs:
        print(format_table(RUN_COLUMNS, [run_row(r) for r in runs]))
    else:
        print("no managed runs yet; hand one over with `tpu-console launch NODE --managed ...`")
    return 0


def _cancel(store: Any, managed_id: str, yes: bool, json_mode: bool) -> int:
    stored = st.load(store, managed_id)
    if stored is None:
        raise UserError(f"no managed run {managed_id!r}; `tpu-console controller status` lists them")
    if not yes:
        raise UserError(f"cancelling {managed_id} stops run {stored.run.current.run_id} and deletes what the "
                        "controller made for it; add --yes")
    for _ in range(10):  # the controller may write it meanwhile: read it again and ask again
        if stored.run.state.terminal:
            break
        stored.run.stop_requested = True
        try:
            st.save(store, stored)
            break
        except Conflict:
            stored = st.load(store, managed_id)
    print(f"{managed_id}: cancel asked; the controller stops it at its next pass", file=sys.stderr)
    return 0


def describe_lease(lease: dict[str, Any] | None) -> str:
    if lease is None:
        return "none (start one with `tpu-console controller start`)"
    holder = lease.get("holder") or {}
    age = time.time() - float(lease.get("renewed_at") or 0)
    stale = " (stale: it stopped renewing)" if age > float(lease.get("ttl_s") or 60) else ""
    return (f"{holder.get('where', '?')} on {holder.get('host', '?')} (pid {holder.get('pid', '?')}), last "
            f"heartbeat {age:.0f} s ago{stale}")


RUN_COLUMNS = ("MANAGED", "NODE", "STATUS", "RUN", "INCARNATIONS", "RECOVERIES", "LAST LOOK", "NOTE")


def run_row(run: ManagedRun) -> tuple[str, ...]:
    seen = run.heartbeat.get("at") if run.heartbeat else None
    return (run.id, run.node, run.status, run.current.run_id or "-", str(len(run.incarnations)),
            f"{len(run.recoveries)}/{run.max_recoveries}",
            f"{time.time() - seen:.0f}s ago" if seen else "-", run.note or "")


def _moment(at: float | None) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%m-%d %H:%M:%S") if at else "-"


def incarnation_lines(run: ManagedRun) -> list[str]:
    """A managed run at a glance: each incarnation (node, zone, from-to, how it ended) and each recovery's
    seconds from the loss to the first new step, what they were made of, and the steps lost."""
    rows = [(str(i.n), i.node, i.zone or "-", i.run_id or "-", _moment(i.created_at), _moment(i.ended_at),
             i.ended or ("running" if not run.state.terminal else run.status.lower()))
            for i in run.incarnations]
    lines = [f"managed run {run.id}: {run.status}" + (f" ({run.note})" if run.note else ""),
             format_table(("#", "NODE", "ZONE", "RUN", "FROM", "TO", "ENDED"), rows)]
    share = goodput(st.timeline(run, time.time()))
    if share.total_s > 0:
        lines.append(f"{share.line()} (over every incarnation)")
    for r in run.recoveries:
        parts = ", ".join(f"{k} {v:.0f}s" for k, v in r.parts().items() if v is not None)
        seconds = f"{r.seconds:.0f} s to the first new step" if r.seconds is not None else "no new step yet"
        lost = f", {r.steps_lost} step(s) lost" if r.steps_lost is not None else ""
        lines.append(f"recovery {r.n} ({r.reason}): {seconds}{lost}" + (f" ({parts})" if parts else ""))
    return lines


def managed_run_of(run_id: str, settings: Settings) -> ManagedRun | None:
    """The managed run one of whose incarnations ran `run_id`, from the controller's store."""
    try:
        runs = st.all_runs(open_store(settings))
    except Exception:  # noqa: BLE001 - an unreadable store: shown without it
        return None
    return next((s.run for s in runs if any(i.run_id == run_id for i in s.run.incarnations)), None)


HANDLERS = {"controller": controller}
