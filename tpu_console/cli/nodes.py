"""Verbs on nodes: `ls`, `create`, `delete`, `idle`, `capacity`."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tpu_console import ssh_identity
from tpu_console.cli import flags, output, prompts
from tpu_console.cli.termination import cancel_on_termination
from tpu_console.domain import CreateRequest, Node, QueuedRequest
from tpu_console.errors import CreateInterrupted, UserError
from tpu_console.providers import capacity, create_options
from tpu_console.providers.base import Provider
from tpu_console.providers.gcp import labels as node_owners
from tpu_console.providers.nodes import cancel_queued, create_node, delete_node, list_nodes
from tpu_console.providers.registry import KNOWN_PROVIDERS, create_provider_name, find_node
from tpu_console.settings import Settings
from tpu_console.views.nodes import (
    COLUMNS,
    REQUEST_COLUMNS,
    format_table,
    node_notes,
    node_record,
    node_row,
    request_record,
    request_row,
)


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    ls = verbs.add_parser(
        "ls",
        parents=[common],
        help="list nodes",
        description="List the nodes of every "
        "configured provider. Providers or zones that fail are warned about on stderr; "
        "the nodes that could be read are still listed.",
    )
    ls.add_argument("--provider", choices=KNOWN_PROVIDERS, help="only this provider's nodes")
    whose = ls.add_mutually_exclusive_group()
    whose.add_argument("--mine", action="store_true", help="only the nodes and requests this user made")
    whose.add_argument("--user", metavar="USER",
                       help="only those USER made (gcp: the tpu-console-user label)")

    adopt = verbs.add_parser(
        "adopt", parents=[common], help="mark a gcp node made elsewhere (gcloud, another tool) as yours",
        description="Add this console's labels (created-by=tpu-console, tpu-console-user, and "
        "tpu-console-project when [gcp] team_project is set) to a gcp node made elsewhere; its other labels "
        "stay. A node another person's console made is not adopted.",
    )
    adopt.add_argument("name", help="the node")

    create = verbs.add_parser(
        "create",
        parents=[common],
        help="create a node",
        description="Create a node. Progress lines go to stderr as they happen.",
        epilog="types: local-WxD (W workers x D devices), local-v6e-8, local-v6e-16, local-v4-16 for the "
        "local provider; v4-16, v5p-8, v6e-8, v6e-16, ... for gcp",
    )
    create.add_argument(
        "name", help="node name: lowercase letters, digits and hyphens, starting with a letter"
    )
    create.add_argument(
        "--type",
        required=True,
        dest="accelerator_type",
        metavar="TYPE",
        help="accelerator type, e.g. v6e-16 or local-2x4",
    )
    create.add_argument(
        "--provider",
        choices=KNOWN_PROVIDERS,
        help="where to create it (default: default_provider, else gcp when a project is "
        "configured, else local)",
    )
    create.add_argument("--zones", metavar="Z1,Z2",
                        help="gcp zones to try in order (default: gcp.zones); auto: gcp.zones ordered by "
                        "the capacity record (`tpu-console capacity`)")
    create.add_argument("--slices", type=int, default=1, metavar="N",
                        help="Multislice: N slices of TYPE joined over the data-center network, created, "
                        "listed and deleted as one node (slices NAME-0 .. NAME-<N-1>); gcp (a queued "
                        "resource with a node count, v4 and later) and local")
    create.add_argument("--direct", action="store_true",
                        help="gcp: the Create Node API (fails at once without capacity) instead of a queued "
                        "request that waits for it (the default for v5e, v5p, v6e)")
    create.add_argument("--race", action="store_true",
                        help="gcp: one queued request per zone at once; the first to become ACTIVE wins and "
                        "the others are deleted")
    create.add_argument("--wait-for", metavar="DURATION",
                        help="gcp: the queued request gives up after this long, e.g. 2h, 45m, 1h30m "
                        "(its valid-until); without it, it waits until deleted")
    pricing = create.add_mutually_exclusive_group()
    pricing.add_argument(
        "--spot",
        dest="spot",
        action="store_true",
        default=True,
        help="spot capacity: cheaper, may be preempted (the default)",
    )
    pricing.add_argument("--on-demand", dest="spot", action="store_false", help="on-demand capacity")
    pricing.add_argument("--reservation", metavar="NAME",
                         help="gcp: create in this reservation (a name in the zone, or its full path)")
    pricing.add_argument("--best-effort", action="store_true",
                         help="gcp: the best-effort tier (TPU API v2alpha1)")
    create.add_argument("--runtime-version", metavar="V", help="gcp TPU software version")
    create.add_argument(
        "--label", action="append", default=[], metavar="KEY=VALUE", help="a label for the node (repeatable)"
    )

    delete = verbs.add_parser(
        "delete",
        parents=[common],
        help="delete a node",
        description="Delete a node and everything on its workers' disks.",
    )
    delete.add_argument("name")
    flags.add_yes(delete, "delete without asking")

    idle = verbs.add_parser(
        "idle", parents=[common], help="READY nodes with no run for a while, and what they cost",
        description="List READY nodes with no live run whose last run ended (or that were created) longer "
        "ago than --after minutes (default: idle_after_minutes, 60), with their cost while idle. "
        "--auto-delete-idle deletes them; --watch S keeps checking every S seconds (a guard to leave "
        "running overnight).",
    )
    idle.add_argument("--after", type=int, metavar="MIN",
                      help="minutes without a run (default idle_after_minutes)")
    idle.add_argument("--auto-delete-idle", action="store_true", help="delete the idle nodes")
    flags.add_yes(idle, "with --auto-delete-idle: do not ask")
    idle.add_argument("--watch", type=float, metavar="S",
                      help="check again every S seconds until interrupted")

    record = verbs.add_parser(
        "capacity", parents=[common], help="what past creates say about each zone's capacity",
        description="Per zone and type, from every create attempt this console made: attempts (cancelled "
        "ones and lost races left out), successes, the median wait from request to READY, and for spot "
        "nodes the preemptions per node-hour. `create --zones auto` orders zones by it.",
    )
    record.add_argument("--type", dest="accelerator_type", metavar="TYPE", help="only this accelerator type")


async def ls(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    listing = await list_nodes(providers, args.provider)
    now = datetime.now(UTC)
    for problem in listing.problems:
        print(f"warning: {problem}", file=sys.stderr)
    wanted = node_owners.sanitise(ssh_identity.user_name() if args.mine else args.user or "")
    if args.mine or args.user is not None:
        if not wanted:
            raise UserError(f"--user {args.user!r} names nobody; give a login name, e.g. --user alice")
        owners = sorted({o for o in map(owner_of, [*listing.nodes, *listing.requests]) if o})
        listing.nodes = [n for n in listing.nodes if owner_of(n) == wanted]
        listing.requests = [r for r in listing.requests if owner_of(r) == wanted]
        if not listing.nodes and not listing.requests:
            print(f"no node or queued request of user {wanted}; owners here: {', '.join(owners) or 'none'}"
                  " (a node made elsewhere has none until `tpu-console adopt NODE`)", file=sys.stderr)
    waiting = [r for r in listing.requests if not r.has_node]  # the others show as their node
    if args.json:
        output.print_json({"nodes": [{**node_record(n, now), "owner": owner_of(n)} for n in listing.nodes],
                           "requests": [{**request_record(r, now), "owner": owner_of(r)}
                                        for r in listing.requests],
                           "problems": listing.problems})
        return 0
    if listing.nodes:
        print(format_table((*COLUMNS, "OWNER"), [(*node_row(n, now), owner_of(n) or "-")
                                                 for n in listing.nodes]))
        for node in listing.nodes:
            if notes := node_notes(node):
                print(f"  {node.name}: {'; '.join(notes)}")
    if waiting:
        table = format_table(REQUEST_COLUMNS, [request_row(r, now) for r in waiting])
        print(("\n" if listing.nodes else "") + table)
    if not listing.nodes and not waiting:
        print("no nodes; create one with `tpu-console create NAME --type TYPE`", file=sys.stderr)
    return 0


def owner_of(item: Node | QueuedRequest) -> str | None:
    """Who made a node or request: its gcp label; a local pod is this console's (it lives in its home);
    None for a node made elsewhere."""
    if item.provider == "local":
        return node_owners.sanitise(ssh_identity.user_name()) or None
    return node_owners.owner(item.labels)


async def adopt(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    provider, node = await find_node(providers, args.name)
    if node.provider != "gcp":
        raise UserError(f"{args.name} is a {node.provider} node: only gcp nodes carry labels (a local pod is "
                        "this console's, an ssh node is whoever configures it)")
    node = await provider.adopt(node.name)
    if args.json:
        output.print_json({"node": node.name, "labels": node.labels})
    else:
        print(f"{node.name}: labelled {owner_of(node)}'s")
    return 0


async def create(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    zones = create_options.parse_zones(
        args.zones, list(settings.gcp.zones), settings.gcp.project, args.accelerator_type, args.slices
    )
    if create_options.is_auto(args.zones):
        output.progress(f"zones by the capacity record: {', '.join(zones)}")
    create_options.check_combination(direct=args.direct, race=args.race)
    provider = create_provider_name(settings, args.provider)
    create_options.check_slices(args.slices, provider, args.accelerator_type, direct=args.direct,
                                race=args.race)
    request = CreateRequest(
        name=args.name,
        accelerator_type=args.accelerator_type,
        zones=zones,
        spot=args.spot,
        runtime_version=args.runtime_version,
        labels=parse_labels(args.label),
        queued=not args.direct,
        reservation=args.reservation,
        best_effort=args.best_effort,
        valid_for_s=create_options.parse_duration(args.wait_for) if args.wait_for else None,
        race=args.race,
        slices=args.slices,
    )
    # SIGTERM or SIGHUP (a CI job cancelled, a terminal closed) stops a waiting create as Ctrl-C does,
    # and its requests are deleted without a question: nobody is there to answer one.
    with cancel_on_termination() as terminated:
        try:
            node = await create_node(providers, provider, request, progress=output.progress)
        except CreateInterrupted as interrupted:
            if terminated.signal is not None:
                output.progress(f"{terminated.signal.name} received")
            cancelled = await _after_interrupt(interrupted, providers, json_mode=args.json,
                                               ask=terminated.signal is None)
            if args.json:
                output.print_json({"interrupted": True, "requests": interrupted.requests,
                                   "cancelled": cancelled})
            return 130 if terminated.signal is None else terminated.exit_status
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if terminated.signal is None or task is None:
                raise
            task.uncancel()  # our own signal's cancel, handled here: no request was out yet
            output.progress(f"{terminated.signal.name} received: stopped before any request was made")
            return terminated.exit_status
    if args.json:
        output.print_json({"node": node_record(node, datetime.now(UTC))})
    else:
        where = f" in {node.zone}" if node.zone else ""
        slices = f" x {node.slices} slices ({', '.join(node.slice_names)})" if node.slices > 1 else ""
        print(
            f"created {node.name}: {node.provider} {node.accelerator_type}{slices}, {node.shape.workers} "
            f"worker{'s' if node.shape.workers != 1 else ''}{where}, {node.state}"
        )
        if node.provider == "gcp":
            print("its VM runs as the project's default service account with the cloud-platform scope, so a "
                  "run's supervisor on it can delete it (launch --on-end delete, --max-cost, --max-hang)",
                  file=sys.stderr)
    return 0


async def _after_interrupt(interrupted: CreateInterrupted, providers: dict[str, Provider], *,
                           json_mode: bool, ask: bool = True) -> bool:
    """Ctrl-C while queued: ask whether to cancel (nobody to ask, or `ask` False after SIGTERM: cancel);
    never leave one silently."""
    names = ", ".join(interrupted.requests)
    try:
        cancel = prompts.cancel_queued(interrupted.requests, json_mode=json_mode) if ask else True
    except (KeyboardInterrupt, EOFError):
        cancel = False
    if not cancel:
        output.progress(f"left queued request(s) {names} waiting: `tpu-console ls` shows them, "
                        "`tpu-console delete NAME --yes` removes them")
        return False
    output.progress(f"cancelling queued request(s) {names}")
    await cancel_queued(providers, interrupted, progress=output.progress)
    output.progress("cancelled: no queued request left behind")
    return True


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"bad label {item!r}: write it as KEY=VALUE, e.g. --label team=rl")
        labels[key] = value
    return labels


async def delete(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    def confirm(found: Node | QueuedRequest) -> None:
        prompts.confirm_delete(found, args.name, yes=args.yes, json_mode=args.json)

    found = await delete_node(providers, args.name, progress=output.progress, confirm=confirm)
    what = "queued request" if isinstance(found, QueuedRequest) else "node"
    if args.json:
        extra = {"queued_request": True} if what != "node" else {}
        output.print_json({"deleted": found.name, "provider": found.provider, **extra})
    else:
        print(f"deleted {found.name}" if what == "node" else f"deleted queued request {found.name}")
    return 0


async def idle(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.observe.idle_watch import watch_idle
    from tpu_console.observe.notifications import Notifier

    minutes = args.after or settings.idle_after_minutes
    if minutes < 1:
        raise UserError("--after must be at least 1 minute")
    if args.auto_delete_idle and not args.yes and not prompts.can_ask(args.json, stderr_too=False):
        raise UserError("refusing to delete idle nodes without --yes")

    notifier = Notifier.from_settings(settings, output.progress)
    told: set[str] = set()  # each node once while it stays idle

    def report(now: datetime, idle: list[Any]) -> None:
        for item in idle:
            if item.node.name not in told:
                notifier.notify("idle", f"{item.describe()}")
        told.intersection_update(i.node.name for i in idle)
        told.update(i.node.name for i in idle)
        if args.json:
            output.print_json(output.idle_record(minutes, idle))
        elif idle:
            print(output.idle_table(idle, now))
        else:
            print(f"no node has been idle for {minutes} min", file=sys.stderr)

    def approve(item: Any) -> bool:
        return args.yes or prompts.yes_no(f"delete idle node {item.node.name}?")

    await watch_idle(
        providers, timedelta(minutes=minutes), report, delete=approve if args.auto_delete_idle else None,
        every_s=args.watch, progress=output.progress,
    )
    return 0


async def capacity_record(
    args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]
) -> int:
    accelerator_type = args.accelerator_type
    if accelerator_type and not accelerator_type.startswith("local-"):
        from tpu_console.providers.gcp.accelerators import canonical_type

        # A multislice is recorded as `2x v6e-16` (`--type 2xv6e-16` finds it too).
        if match := re.match(r"^(\d+)x\s*(\S+)$", accelerator_type.strip()):
            accelerator_type = f"{match.group(1)}x {canonical_type(match.group(2))}"
        else:
            accelerator_type = canonical_type(accelerator_type)
    records = capacity.summarize(capacity.CapacityStore().attempts(accelerator_type), datetime.now(UTC))
    if args.json:
        output.print_json({"zones": [output.capacity_record(r) for r in records]})
    elif records:
        print(output.capacity_table(records))
    else:
        print("no create attempts recorded yet" + (f" for {accelerator_type}" if accelerator_type else ""),
              file=sys.stderr)
    return 0


HANDLERS = {"ls": ls, "adopt": adopt, "create": create, "delete": delete, "idle": idle,
            "capacity": capacity_record}
