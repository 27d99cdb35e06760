"""`tpu-console controller start | status | logs | stop | cancel`: the daemon that brings managed runs back
(controller/daemon.py), and what it did, read from the controller's store (docs/managed-runs.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.controller import daemon, gce, remote
from tpu_console.controller import state as st
from tpu_console.controller.lease import read_lease
from tpu_console.controller.state import ManagedRun
from tpu_console.controller.store import open_store
from tpu_console.errors import UserError
from tpu_console.providers.base import Provider
from tpu_console.settings import Settings
from tpu_console.views.managed import MANAGED_COLUMNS, describe_lease, managed_row
from tpu_console.views.nodes import format_table


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    controller = verbs.add_parser(
        "controller", help="the daemon that brings managed runs back after preemptions",
        description="One controller serves every managed run of a project (launch --managed, a job file's "
        "[recovery]): it recreates a lost node, bootstraps, syncs and relaunches the run, which resumes from "
        "its own checkpoint. Its state is beside the run records ([gcp] bucket, or this home's folder).",
    )
    sub = controller.add_subparsers(dest="controller_verb", metavar="start|status|logs|stop|cancel|delete-vm",
                                    required=True)
    start = sub.add_parser("start", parents=[common], help="start the daemon on this machine, or --on HOST",
                           description="A systemd user service where `systemctl --user` works, else a "
                           "detached process; says which, and whether it survives a reboot. With --on, "
                           "the console is installed on that SSH host first (its state must be in the "
                           "bucket: [gcp] bucket).")
    start.add_argument("--detached", action="store_true",
                       help="a detached process even where systemd user services work")
    sub.add_parser("status", parents=[common], help="the daemon, its last heartbeat, every managed run")
    logs = sub.add_parser("logs", parents=[common], help="the daemon's log")
    logs.add_argument("--lines", "-n", type=int, default=50, metavar="N", help="the last N lines (50)")
    stop = sub.add_parser("stop", parents=[common], help="stop the daemon here, or --on HOST (its lease "
                          "given back)")
    for parser in (start, logs, stop):
        where = parser.add_mutually_exclusive_group()
        where.add_argument("--on", metavar="HOST", help="on this SSH host: user@host[:port] (this console's "
                           "key) or an [[ssh.nodes]] name")
        where.add_argument("--gce", action="store_true",
                           help=f"on the Compute Engine VM {gce.VM_NAME} (start makes it, or starts it)")
        parser.add_argument("--zone", help="the VM's zone (--gce; default: the first of [gcp] zones)")
    start.add_argument("--machine-type", default=gce.MACHINE_TYPE, help=f"the VM's ({gce.MACHINE_TYPE})")
    stop.add_argument("--delete", action="store_true", help="with --gce: delete the VM too")
    delete_vm = sub.add_parser("delete-vm", parents=[common], help=f"delete the VM {gce.VM_NAME} (--gce)",
                               description="The controller on it stops with it; its lease runs out.")
    delete_vm.add_argument("--zone", help="the VM's zone (default: the first of [gcp] zones)")
    flags.add_yes(delete_vm, "delete without asking")
    cancel = sub.add_parser("cancel", parents=[common], help="stop a managed run and what was made for it",
                            description="The run is stopped, and every node and queued request the "
                            "controller made for it deleted (a request filled later too).")
    cancel.add_argument("managed_id", metavar="MANAGED_ID")
    flags.add_yes(cancel, "cancel without asking")


async def controller(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    verb = args.controller_verb
    if verb == "delete-vm":
        return await _delete_vm(args, settings)
    if getattr(args, "delete", False) and not args.gce:
        raise UserError("--delete deletes the controller's VM: give it with --gce")
    if getattr(args, "on", None) or getattr(args, "gce", False):
        return await _elsewhere(args, settings)
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
        print(format_table(MANAGED_COLUMNS, [managed_row(r) for r in runs]))
    else:
        print("no managed runs yet; hand one over with `tpu-console launch NODE --managed ...`")
    return 0


async def _elsewhere(args: argparse.Namespace, settings: Settings) -> int:
    """start, logs or stop on an SSH host (--on) or the controller's VM (--gce)."""
    verb = args.controller_verb
    host = remote.resolve_host(args.on, settings) if args.on else None
    where = f"--on {args.on}" if args.on else "--gce"
    if verb == "start":
        if host is not None:
            started = await remote.start_on(settings, host, detached=args.detached, progress=output.progress)
        else:
            started = await gce.start_gce(settings, zone=args.zone, machine_type=args.machine_type,
                                          detached=args.detached, progress=output.progress)
        if args.json:
            output.print_json(started)
        else:
            how = ("a systemd user service" if started["kind"] == "systemd" else
                   f"a detached process (pid {started['detail']})")
            reboot = "survives a reboot" if started.get("survives_reboot") else "does not survive a reboot"
            print(f"controller running on {started['host']} as {how}: {reboot}; log there: {started['log']} "
                  f"(`tpu-console controller logs {where}`)")
        return 0
    verb_there = ["logs", "--lines", str(args.lines)] if verb == "logs" else ["stop"]
    if host is not None:
        said = await remote.run_there(host, verb_there)
    elif verb == "stop" and args.delete:
        try:  # the lease given back at once, rather than running out with the VM
            output.progress(await gce.on_vm(settings, args.zone, ["stop"]))
        except UserError as exc:
            output.progress(f"the controller there was not stopped first: {exc}")
        said = "the VM is deleted with it" if await gce.delete_vm(settings, args.zone, output.progress) else \
            f"no VM {gce.VM_NAME} to delete"
    else:
        said = await gce.on_vm(settings, args.zone, verb_there)
    if verb == "logs":
        print(said)
    else:
        print(f"{args.on or gce.VM_NAME}: {said}", file=sys.stderr)
    return 0


async def _delete_vm(args: argparse.Namespace, settings: Settings) -> int:
    if not args.yes:
        raise UserError(f"delete-vm deletes the VM {gce.VM_NAME} and its disk (the controller on it stops); "
                        "add --yes")
    deleted = await gce.delete_vm(settings, args.zone, output.progress)
    print(f"deleted the VM {gce.VM_NAME}" if deleted else f"no VM {gce.VM_NAME} there", file=sys.stderr)
    return 0


def _cancel(store: Any, managed_id: str, yes: bool, json_mode: bool) -> int:
    stored = st.load(store, managed_id)
    if stored is None:
        raise UserError(f"no managed run {managed_id!r}; `tpu-console controller status` lists them")
    if not yes:
        raise UserError(f"cancelling {managed_id} stops run {stored.run.current.run_id} and deletes what the "
                        "controller made for it; add --yes")
    st.request_cancel(store, managed_id)
    print(f"{managed_id}: cancel asked; the controller stops it at its next pass", file=sys.stderr)
    return 0


def managed_run_of(run_id: str, settings: Settings) -> ManagedRun | None:
    """The managed run one of whose incarnations ran `run_id`, from the controller's store."""
    try:
        runs = st.all_runs(open_store(settings))
    except Exception:  # noqa: BLE001 - an unreadable store: shown without it
        return None
    return next((s.run for s in runs if any(i.run_id == run_id for i in s.run.incarnations)), None)


HANDLERS = {"controller": controller}
