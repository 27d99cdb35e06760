"""Verbs on nodes: `ls`, `create`, `delete`, `idle`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from tpu_console.cli import flags, output, prompts
from tpu_console.errors import UserError
from tpu_console.model import CreateRequest, Node
from tpu_console.node_table import COLUMNS, format_table, node_record, node_row
from tpu_console.providers.base import Provider
from tpu_console.providers.nodes import create_node, delete_node, list_nodes
from tpu_console.providers.registry import KNOWN_PROVIDERS, create_provider_name
from tpu_console.settings import Settings


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
    create.add_argument("--zones", metavar="Z1,Z2", help="gcp zones to try in order (default: gcp.zones)")
    pricing = create.add_mutually_exclusive_group()
    pricing.add_argument(
        "--spot",
        dest="spot",
        action="store_true",
        default=True,
        help="spot capacity: cheaper, may be preempted (the default)",
    )
    pricing.add_argument("--on-demand", dest="spot", action="store_false", help="on-demand capacity")
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


async def ls(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    listing = await list_nodes(providers, args.provider)
    now = datetime.now(UTC)
    for problem in listing.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if args.json:
        output.print_json(
            {"nodes": [node_record(n, now) for n in listing.nodes], "problems": listing.problems}
        )
    elif listing.nodes:
        print(format_table(COLUMNS, [node_row(n, now) for n in listing.nodes]))
    else:
        print("no nodes; create one with `tpu-console create NAME --type TYPE`", file=sys.stderr)
    return 0


async def create(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    zones = (
        tuple(z.strip() for z in args.zones.split(",") if z.strip())
        if args.zones
        else tuple(settings.gcp.zones)
    )
    request = CreateRequest(
        name=args.name,
        accelerator_type=args.accelerator_type,
        zones=zones,
        spot=args.spot,
        runtime_version=args.runtime_version,
        labels=parse_labels(args.label),
    )
    provider = create_provider_name(settings, args.provider)
    node = await create_node(providers, provider, request, progress=output.progress)
    if args.json:
        output.print_json({"node": node_record(node, datetime.now(UTC))})
    else:
        where = f" in {node.zone}" if node.zone else ""
        print(
            f"created {node.name}: {node.provider} {node.accelerator_type}, {node.shape.workers} "
            f"worker{'s' if node.shape.workers != 1 else ''}{where}, {node.state}"
        )
    return 0


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"bad label {item!r}: write it as KEY=VALUE, e.g. --label team=rl")
        labels[key] = value
    return labels


async def delete(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    def confirm(node: Node) -> None:
        prompts.confirm_delete(node, args.name, yes=args.yes, json_mode=args.json)

    node = await delete_node(providers, args.name, progress=output.progress, confirm=confirm)
    if args.json:
        output.print_json({"deleted": node.name, "provider": node.provider})
    else:
        print(f"deleted {node.name}")
    return 0


async def idle(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.runs.idle_watch import watch_idle
    from tpu_console.runs.notifications import Notifier

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


HANDLERS = {"ls": ls, "create": create, "delete": delete, "idle": idle}
