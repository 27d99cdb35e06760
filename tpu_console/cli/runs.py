"""Verbs on runs once launched: `status`, `logs`, `stop`, `stacks`, `runs` (`ls`, `show`, `compare`) and
`metrics` (`launch` is cli/launch.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tpu_console.cli import flags, output, prompts, run_history
from tpu_console.domain import worker_slices
from tpu_console.errors import NotFound, UserError
from tpu_console.history import bucket_record, discovery, ownership
from tpu_console.history.resolve import resolve_run
from tpu_console.history.store import RunStore
from tpu_console.launch.stop import stop as stop_run
from tpu_console.observe import lookup
from tpu_console.observe.notifications import Notifier
from tpu_console.observe.stragglers import paces, stragglers
from tpu_console.providers.base import Provider
from tpu_console.secrets import SecretMasker
from tpu_console.settings import Settings
from tpu_console.views import runs as run_table
from tpu_console.views.nodes import format_age, format_table

RUNS_SUB_COMMANDS = ("ls", "show", "compare")
# Options that take a value, up to and including the `runs` sub-commands' own (to find the positionals).
VALUE_OPTIONS = ("--project", "--limit")


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    runs = verbs.add_parser(
        "runs", help="list launched runs; show one; compare several",
        description="Runs launched from this machine. `tpu-console runs [NODE]` is short for "
        "`tpu-console runs ls [NODE]`.",
    )
    sub = runs.add_subparsers(dest="runs_verb", metavar="ls|show|compare", required=True)
    ls = sub.add_parser(
        "ls", parents=[common], help="runs, most recent first",
        description="Runs launched from this machine, most recent first; unfinished ones are probed now.",
    )
    ls.add_argument("node", nargs="?", help="only this node's runs")
    ls.add_argument("more", nargs="*", help=argparse.SUPPRESS)
    ls.add_argument("--limit", type=int, default=50, help="at most this many runs (default 50)")
    show = sub.add_parser(
        "show", parents=[common], help="one run in full",
        description="One run in full: where and what it ran, each worker's state, and its summary.",
    )
    show.add_argument("targets", nargs="*", metavar="NODE|RUN_ID",
                      help="a run id, or a node (its latest run) and optionally one of its runs")
    compare = sub.add_parser(
        "compare", parents=[common], help="runs' summaries side by side",
        description="Two runs or more side by side, with B vs A in percent.",
    )
    compare.add_argument("targets", nargs="*", metavar="RUN", help="run ids (or nodes: their latest run)")

    status = verbs.add_parser(
        "status", parents=[common], help="a run's state on every worker",
        description="Each worker's state, exit status and latest step metrics; the first failure.",
    )
    flags.add_run_target(status)

    logs = verbs.add_parser(
        "logs", parents=[common], help="a run's output, prefixed by worker",
        description="The end of each worker's output.log, prefixed [i]; with --follow, new output as it "
        "comes until every worker's job has ended (exit 0 when the run succeeded, else 1).",
    )
    flags.add_run_target(logs)
    flags.add_worker(logs)
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    logs.add_argument(
        "--lines", "-n", default="50", metavar="N",
        help="start with the last N lines of each worker (default 50; `all` for the whole log)",
    )

    stop = verbs.add_parser(
        "stop", parents=[common], help="stop a run on every worker",
        description="SIGTERM the job's process group on every worker, SIGKILL it after --grace seconds.",
    )
    flags.add_run_target(stop)
    flags.add_yes(stop, "stop without asking")
    stop.add_argument("--grace", type=float, default=10.0, metavar="S", help="seconds before SIGKILL (10)")

    stacks = verbs.add_parser(
        "stacks", parents=[common], help="where a run is stuck: every worker's Python stacks, grouped",
        description="Signal every worker's job (SIGUSR1: the trainer dumps every thread's stack into its run "
        "folder), collect the dumps, group identical stacks and name the odd ones out; a worker whose job "
        "does not answer (stopped, or blocked where Python cannot run) is named with its process state. "
        "Beside them, what libtpu says of each worker's chips (busy, idle for how long), where it says it.",
    )
    flags.add_run_target(stacks)
    stacks.add_argument("--wait", type=float, default=5.0, metavar="S",
                        help="seconds to wait for each worker's dump (default 5)")
    stacks.add_argument("--address", default="localhost:8431",
                        help="libtpu's metrics service on each worker")

    metrics = verbs.add_parser(
        "metrics", parents=[common], help="live HBM and duty cycle of every TPU device, from libtpu",
        description="Read libtpu's runtime metrics (HBM in use and total, tensorcore duty cycle) on every "
        "worker, without the trainer and without importing JAX there: they show even while a job hangs. "
        "Workers where nothing reports them (CPU pods) say why.",
    )
    metrics.add_argument("node")
    flags.add_worker(metrics)
    metrics.add_argument("--address", default="localhost:8431",
                         help="libtpu's metrics service on each worker")


def with_runs_sub_command(argv: Sequence[str]) -> list[str]:
    """`runs [NODE]` is short for `runs ls [NODE]`, and options may come before the sub-command
    (`runs --json show RUN`): give argparse the sub-command first. A node named `show` is `runs ls show`."""
    argv = list(argv)
    verb = _first_positional(argv)
    if verb is None or argv[verb] != "runs":
        return argv
    rest = argv[verb + 1 :]
    first = _first_positional(rest)
    if first is not None and rest[first] in RUNS_SUB_COMMANDS:
        rest = [rest[first], *rest[:first], *rest[first + 1 :]]
    elif first is None and any(a in ("-h", "--help") for a in rest):
        pass  # `runs --help`: the sub-commands
    else:
        rest = ["ls", *rest]
    return [*argv[: verb + 1], *rest]


def _first_positional(argv: Sequence[str]) -> int | None:
    skip = False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in VALUE_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return index
    return None


# ---- the history -------------------------------------------------------------------------------------------


async def runs(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    if args.runs_verb == "show":
        return await run_history.show(args.targets, args.json, providers)
    if args.runs_verb == "compare":
        return await run_history.compare(args.targets, args.json, providers)
    if args.more:
        raise UserError(f"unexpected arguments after {args.node}: {' '.join(args.more)}; "
                        "use `runs NODE`, `runs show RUN` or `runs compare RUN_A RUN_B`")
    store = RunStore()
    # the bucket's run records first (runs whose node is gone, a colleague's): the history is their cache
    if warning := await asyncio.to_thread(bucket_record.merge_into_history, settings, store):
        print(f"warning: {warning}", file=sys.stderr)
    # the nodes' run folders too: a run launched from another console is on its pod (history/discovery.py)
    if args.node:
        with contextlib.suppress(NotFound):
            await discovery.discover(providers, store, args.node)
    else:
        await discovery.discover_all(providers, store)
    views = await lookup.list_runs(providers, args.node, store=store, limit=args.limit)
    if args.json:
        output.print_json({"runs": [{**run_table.run_record(v), "launched_by": v.record.launched_by}
                                    for v in views]})
    elif views:
        now = datetime.now(UTC)
        print(format_table(run_table.RUN_COLUMNS, [run_table.run_row(v, now) for v in views]))
        print("\n".join(await asyncio.to_thread(_managed_lines, settings, {v.record.run_id for v in views})))
    else:
        print("no runs yet; start one with `tpu-console launch NODE --config FILE`", file=sys.stderr)
    return 0


def _managed_lines(settings: Settings, listed: set[str]) -> list[str]:
    """Under the runs: the managed runs among them (the controller's), and the acting controller."""
    from tpu_console.controller import state as st
    from tpu_console.controller.lease import read_lease
    from tpu_console.controller.store import open_store
    from tpu_console.views.managed import describe_lease

    try:
        store = open_store(settings)
        managed = [s.run for s in st.all_runs(store)
                   if any(i.run_id in listed for i in s.run.incarnations)]
        lease = read_lease(store) if managed else None
    except Exception:  # noqa: BLE001 - the controller's state unreadable: the runs alone
        return []
    lines = [f"managed {r.id}: {r.status.lower()}, run {r.current.run_id} on {r.node}, incarnation "
             f"{r.current.n}, {len(r.recoveries)} recoveries" + (f" ({r.note})" if r.note else "")
             for r in managed]
    return lines + ([f"controller: {describe_lease(lease)}"] if managed else [])


# ---- one run -----------------------------------------------------------------------------------------------


async def status(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.observe import foreign_metrics

    record = await resolve_run(RunStore(), providers, args.target, args.run_id)
    # one look at the node: the run's state, the supervisor's decisions and a command job's W&B and
    # TensorBoard readings over the same connections
    view = await lookup.run_status(providers, record.run_id, foreign=True)
    masker = SecretMasker.for_node(record.node)  # notes quote worker output, which may hold a leaked value
    # a command job's progress: where its steps come from, its W&B summary and TensorBoard scalars
    steps_note = foreign_metrics.steps_note(view.record, {s.worker: s.events.last_step for s in view.workers})
    foreign = view.foreign
    decisions = view.decisions
    pace = paces({s.worker: s.events.recent_steps for s in view.workers if s.events.recent_steps})
    slow_lines = [line for _, line in sorted(stragglers(pace).items())] if not view.record.finished else []
    if args.json:
        document = run_table.run_record(view)
        # the pace over the last 20 steps (observe/stragglers.py)
        document["pace"] = [p.to_json() for _, p in sorted(pace.items())]
        document["stragglers"] = slow_lines
        document["steps_source"] = steps_note
        document["launched_by"] = view.record.launched_by
        document["foreign_metrics"] = foreign.to_json() if foreign is not None else None
        document["supervisor"] = None if decisions is None else [
            {"t": d.t, "decision": d.decision, "message": d.message, **d.fields} for d in decisions]
        document["hang"] = await hang_report(providers, view, decisions)
        print(masker.mask(json.dumps(document, indent=2)))
        return 0
    record = view.record
    age = format_age(record.started_at, datetime.now(UTC))
    print(f"{record.run_id}  {record.node} ({record.provider} {record.accelerator_type})  {view.state}  "
          f"started {age} ago")
    if not ownership.is_mine(record.launched_by):
        print(f"launched by {ownership.describe(record.launched_by)}")
    listed = view.workers
    if len(view.workers) > run_table.SUMMARY_AFTER:  # a large run: counts by state, the odd ones out listed
        counts, listed = run_table.worker_summary(view.workers)
        print("\n".join(counts))
    if listed:
        slice_of = worker_slices(record.slices, record.workers)  # {} but on a multislice
        worker_rows = [run_table.worker_row(s, slice_of.get(s.worker)) for s in listed]
        print(masker.mask(format_table(run_table.WORKER_COLUMNS, worker_rows)))
    if len(listed) < len(view.workers):
        print(f"({len(view.workers) - len(listed)} workers are in the counts only; --json lists them all)")
    for line in ([steps_note] if steps_note else []) + (foreign.lines() if foreign is not None else []):
        print(masker.mask(line))
    for line in slow_lines:
        print(f"straggler: {line}")
    if view.failure:
        print(masker.mask(f"failed first: {view.failure}"))
    if view.state == "partially-dead":
        alive = run_table.worker_ranges([s.worker for s in view.workers if not s.done])
        print(f"workers {alive} still run after that failure and will likely hang; stop them with "
              f"`tpu-console stop {record.node} {record.run_id}`")
    for decision in decisions or []:
        print(masker.mask(f"supervisor: {decision.message}"))
    if hang := await hang_report(providers, view, decisions):
        print(masker.mask(f"hang: {hang}"))
    if view.problem:
        print(f"note: {view.problem}", file=sys.stderr)
    return 0


async def hang_report(providers: dict[str, Provider], view: Any, decisions: list | None) -> str | None:
    """While the supervisor's last word is that no worker steps (the hang budget) and none has stepped
    since: every worker's stacks, read as who waits where and who never reached it
    (observe/hang_report.py)."""
    from tpu_console.observe.hang_report import hang_line
    from tpu_console.observe.stacks import collect_stacks

    if view.record.finished or not decisions or decisions[-1].decision != "silent":
        return None
    stepped = max((t for s in view.workers for t, _ in s.events.recent_steps.values()), default=0.0)
    if stepped > decisions[-1].t:
        return None  # it stepped again since
    return hang_line(await collect_stacks(providers, view.record))


async def logs(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    lines = parse_lines(args.lines)
    collected: list[dict[str, Any]] = []

    def on_line(worker: int, text: str) -> None:
        text = masker.mask(text)
        if args.json:
            collected.append({"worker": worker, "text": text})
        else:
            print(f"[{worker}] {text}", flush=True)

    record = await resolve_run(RunStore(), providers, args.target, args.run_id)
    masker = SecretMasker.for_node(record.node)  # a value a job printed is shown as ***
    view = await lookup.logs(
        providers, record.run_id, on_line, workers=args.worker, lines=lines, follow=args.follow
    )
    if args.json:
        output.print_json({"run_id": view.record.run_id, "state": view.state, "failure": view.failure,
                           "lines": collected})
    elif args.follow:
        print(f"{view.record.run_id}: {view.state}" + (f": {view.failure}" if view.failure else ""),
              file=sys.stderr)
    if args.follow:  # the run ended while someone watched: tell their desktop (the pod tells the webhook)
        Notifier.from_settings(settings, output.progress).notify(
            view.state, f"run {view.record.run_id} on {view.record.node} {view.state}")
    if args.follow:
        return 0 if view.state == "succeeded" else 1
    return 0


def parse_lines(text: str) -> int | None:
    if text.strip().lower() == "all":
        return None
    try:
        lines = int(text)
    except ValueError:
        raise UserError(f"--lines {text!r} is not a number; give a count like 100, or all") from None
    if lines < 0:
        raise UserError(f"--lines {lines} is negative; give a count like 100, or all")
    return lines


async def stop(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    record = await resolve_run(RunStore(), providers, args.target, args.run_id)
    prompts.confirm_stop(record, yes=args.yes, json_mode=args.json)
    view, stops = await stop_run(providers, record.run_id, grace_s=args.grace)
    unreachable = [s for s in stops if s.outcome == "unreachable"]
    if args.json:
        output.print_json({"run_id": record.run_id, "state": view.state,
                           "workers": [run_table.stop_record(s) for s in stops]})
    else:
        print(output.stop_table(stops), file=sys.stderr)
        print(f"{record.run_id}: {view.state}")
    return 1 if unreachable else 0


async def stacks(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.observe.hang_report import hang_line
    from tpu_console.observe.stacks import collect_stacks

    if args.wait <= 0:
        raise UserError(f"--wait {args.wait:g} must be positive; give seconds, e.g. --wait 5")
    record = await resolve_run(RunStore(), providers, args.target, args.run_id)
    found = await collect_stacks(providers, record, wait_s=args.wait, address=args.address)
    masker = SecretMasker.for_node(record.node)
    hang = hang_line(found)
    if args.json:
        print(masker.mask(json.dumps({**found.to_json(), "hang": hang}, indent=2)))
        return 0
    print(masker.mask(f"{record.run_id} on {record.node}: {found.summary()}"))
    if hang and len(found.groups) + len(found.silent) > 1:
        print(masker.mask(f"hang: {hang}"))
    if chips := found.device_line():
        print(masker.mask(chips))
    for stack_group in found.groups:
        print(masker.mask(f"\n--- {found.who(stack_group)}: {stack_group.where}\n{stack_group.stack}"))
    return 0


async def metrics(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.observe.device_metrics import read_node_metrics

    node, answers = await read_node_metrics(providers, args.node, args.worker, args.address)
    if args.json:
        output.print_json({"node": node.name, "workers": [
            {"worker": a.worker, "not_reported": a.not_reported,
             "devices": [vars(d) for d in a.devices]} for a in answers]})
        return 0
    print(output.metrics_table(answers))
    return 0


HANDLERS = {
    "runs": runs, "status": status, "logs": logs, "stop": stop, "metrics": metrics, "stacks": stacks,
}
