"""Verbs on runs: `launch`, `status`, `logs`, `stop`, `stacks`, `runs` (`ls`, `show`, `compare`) and
`metrics`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from tpu_console.cli import flags, output, prompts, run_history
from tpu_console.domain import Node, worker_slices
from tpu_console.errors import NotFound, UserError
from tpu_console.history import bucket_record, discovery, ownership
from tpu_console.history.resolve import resolve_run
from tpu_console.history.store import RunStore
from tpu_console.launch.job_kinds import ValidatedConfig
from tpu_console.launch.job_spec import JobSpec, load_job_file
from tpu_console.launch.start import launch as launch_run
from tpu_console.launch.stop import stop as stop_run
from tpu_console.observe import lookup
from tpu_console.observe.notifications import Notifier
from tpu_console.observe.stragglers import paces, stragglers
from tpu_console.observe.supervision import SupervisionPolicy, policy_from_options
from tpu_console.providers.base import Provider
from tpu_console.secrets import SecretMasker
from tpu_console.settings import Settings
from tpu_console.views import runs as run_table
from tpu_console.views.nodes import format_age, format_table

RUNS_SUB_COMMANDS = ("ls", "show", "compare")
# Options that take a value, up to and including the `runs` sub-commands' own (to find the positionals).
VALUE_OPTIONS = ("--project", "--limit")


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    launch = verbs.add_parser(
        "launch",
        parents=[common],
        help="start a job on every worker of a node: the trainer, or your own command",
        usage="tpu-console launch NODE [options] (--config FILE [--set K=V] | --job FILE.toml "
        "[-- COMMAND...] | -- COMMAND...)",
        description="With --config: validate the config (and --set overrides) here, check with the TPU "
        "compiler's plan that it fits the node's TPU type (local pods: the type they rehearse), then start "
        "`python -m trainer` detached on the selected workers, each in ~/tpu-console/runs/RUN_ID/. "
        "With -- COMMAND (an argv, no shell: write bash -c '...' for one) or a job file: run it in the "
        "project `sync --dir/--git` put on the workers, with its setup's environment, after the same checks "
        "(docs/contract.md lists the environment every job gets). Prints the run id.",
    )
    launch.add_argument("node")
    flags.add_config(launch, "override a config key, e.g. --set rollout.n=8 (repeatable)", required=False)
    launch.add_argument(
        "--job", metavar="FILE.toml",
        help="a job file: command, project (dir or git), setup, env, metrics, supervisor options; its "
        "project and setup are made current first; flags given here win over it, and a -- COMMAND over its "
        "command",
    )
    flags.add_env_file(
        launch, "KEY=value secrets (WANDB_API_KEY, HF_TOKEN) uploaded as a 0600 file and sourced by the job"
    )
    flags.add_worker(launch, "workers: all (default); a subset only on local and ssh pods")
    flags.add_python(
        launch,
        "interpreter on the workers (default: the environment `bootstrap` made, ~/tpu-console/env; "
        "this interpreter for local pods that were not bootstrapped)",
    )
    launch.add_argument(
        "--kill-stale", action="store_true",
        help="first kill processes still holding the TPU and remove /tmp/libtpu_lockfile on every worker",
    )
    launch.add_argument(
        "--no-code-check", dest="check_code", action="store_false",
        help="launch even if the workers run different code or JAX versions (a command: different "
        "projects, setups or Pythons)",
    )
    launch.add_argument(
        "--skip-port-check", dest="check_ports", action="store_false",
        help="launch without first checking that every worker reaches the JAX coordinator's port (and, on "
        "a multislice, megascale's): for a job that uses neither, on a network that opens only its own ports",
    )
    launch.add_argument(
        "--check", action="store_true",
        help="first run `tpu-console doctor NODE` (every chip, link and port, docs/doctor.md) and launch "
        "nothing when it names a fault",
    )
    launch.add_argument(
        "--no-plan-check", dest="check_plan", action="store_false",
        help="launch even if the TPU compiler's plan says the config does not fit the node's type",
    )
    launch.add_argument(
        "--recover", action="store_true",
        help="stay with the run: if the node is preempted, delete and recreate it, bootstrap, sync and "
        "relaunch from the latest checkpoint (needs checkpoint.dir outside the node and "
        "checkpoint.every_steps)",
    )
    launch.add_argument(
        "--managed", action="store_true",
        help="hand the run to the controller (`tpu-console controller start`), which recreates a lost node, "
        "bootstraps, syncs and relaunches it with every option given here; the program resumes from its own "
        "checkpoint (docs/managed-runs.md)",
    )
    launch.add_argument("--max-recoveries", type=int, default=None, metavar="N",
                        help="with --recover or --managed (default 3)")
    launch.add_argument("--max-total-cost", metavar="USD",
                        help="with --managed: no recovery once all its nodes together cost this much")
    launch.add_argument("--deadline", metavar="DURATION",
                        help="with --managed: no recovery begins this long after the launch (e.g. 12h)")
    launch.add_argument("--doctor", action=argparse.BooleanOptionalAction, default=None,
                        help="with --managed: the pod doctor checks each new node before the relaunch "
                        "(default: on, but for local pods; over a job file's [recovery] doctor)")
    launch.add_argument("--watch-every", type=float, default=30.0, metavar="S",
                        help="with --recover: seconds between two looks at the node and the run (default 30)")
    launch.add_argument(
        "--fail-fast", action="store_true",
        help="the run's supervisor on the pod stops the other workers as soon as one worker's job fails",
    )
    launch.add_argument(
        "--on-end", choices=("keep", "delete"), default=None,
        help="delete: the supervisor deletes the node (and its queued request) once every worker's job has "
        "ended and --grace has passed, unless a newer run started on it (default keep)",
    )
    launch.add_argument("--grace", metavar="DURATION",
                        help="with --on-end delete: how long to wait after the run ends (default 10m)")
    launch.add_argument(
        "--max-cost", metavar="USD",
        help="the supervisor stops the run (SIGTERM first, so the trainer checkpoints) and deletes the node "
        "once the run has cost this much at the node's hourly price",
    )
    launch.add_argument(
        "--price-per-hour", metavar="USD",
        help="the node's price for --max-cost, where the price table has none (local, ssh) or to override it",
    )
    launch.add_argument(
        "--max-hang", metavar="DURATION",
        help="the supervisor stops the run and deletes the node when no worker made a step for this long "
        "(e.g. 30m)",
    )
    launch.add_argument(
        "--restart-on", metavar="CLASSES",
        help="restart every job from its latest checkpoint when the run fails with one of these failure "
        "classes: transient (lost_worker, distributed_timeout, tpu_in_use, preempted), or a comma list",
    )
    launch.add_argument(
        "--on-straggler", choices=("report", "restart"), default=None,
        help="the supervisor names a worker whose step time over its last 20 steps is 1.5x the others' "
        "median (report), or restarts every job from its checkpoint (restart, up to --max-restarts)",
    )
    launch.add_argument("--max-restarts", metavar="N",
                        help="with --restart-on: restarts allowed per failure class (default 3)")
    launch.add_argument(
        "--metrics", metavar="FORMAT|REGEX",
        help="how a command's output gives its steps, over the job file's [metrics]: a format (auto, seeds, "
        "maxtext, jsonl, loop, tqdm, keras, none) or a regex with a named group step, e.g. "
        "'iter (?P<step>\\d+) loss (?P<loss>[\\d.]+)' (default auto: found from the output)",
    )

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


# ---- launch ------------------------------------------------------------------------------------------------


def plan_check(enabled: bool) -> Callable[[ValidatedConfig, Node], Awaitable[None]] | None:
    """launch's check of the TPU compiler's plan (experiments/planning.py `launch_check`); None with
    --no-plan-check."""
    from tpu_console.experiments.planning import launch_check

    return launch_check(output.progress) if enabled else None


async def launch(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    job = job_from_args(args)
    if args.recover:
        if job is not None:
            raise UserError("--recover relaunches the bundled trainer from its checkpoints; for a command "
                            "use --restart-on transient (the program resumes from its own checkpoints)")
        return await _launch_with_recovery(args, settings, providers)
    policy = supervision_policy(args, job)
    if args.check:
        await check_before_launch(args, providers, job)
    managed = args.managed or (job is not None and job.recovery is not None)
    if managed:
        budgets = await _check_managed(args, job, policy, providers, settings)
    webhook = settings.notify.webhook_url
    result = await launch_run(
        providers, args.node, args.config, args.overrides, args.env_file, args.worker,
        python=args.python, kill_stale=args.kill_stale, fail_fast=args.fail_fast, check_code=args.check_code,
        check_ports=args.check_ports,
        progress=output.progress, on_worker=output.worker_progress,
        before_send=plan_check(args.check_plan) if job is None else None,
        policy=policy, webhook_url=webhook.get_secret_value() if webhook else None, job=job,
    )
    if result.ok:
        print(f"{result.run_id}: supervised on worker {result.workers[0]}: {describe_policy(policy)}",
              file=sys.stderr)
    if result.ok and managed:
        await _hand_over(args, job, policy, result, settings, budgets)
    if args.json:
        output.print_json(run_table.launch_record(result))
    else:
        print(output.launch_table(result), file=sys.stderr)
        print(result.run_id)
        if result.ok:
            print(f"follow it with `tpu-console logs {result.node.name} --follow`", file=sys.stderr)
        else:
            print("error: the job did not start on every worker; nothing is left running", file=sys.stderr)
    return 0 if result.ok else 1


async def check_before_launch(args: argparse.Namespace, providers: dict[str, Provider],
                              job: JobSpec | None) -> None:
    """launch --check: the doctor on the node first; UserError with its first finding (nothing launched)."""
    from tpu_console.doctor import check_node

    python = args.python if job is None else None  # a command's interpreter may have no JAX: bootstrap's
    report = await check_node(providers, args.node, python=python, progress=output.progress)
    if not report.ok:
        more = f" (and {len(report.findings) - 1} more: `tpu-console doctor {args.node}`)" \
            if len(report.findings) > 1 else ""
        raise UserError(f"{report.findings[0].line}{more}; nothing was launched")
    output.progress(report.lines()[0])


async def _launch_with_recovery(
    args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]
) -> int:
    from tpu_console.experiments.recovery import launch_with_recovery

    if args.worker != "all":
        raise UserError("--recover relaunches on every worker; leave out --worker")
    policy = supervision_policy(args)
    webhook = settings.notify.webhook_url

    def launched(result: Any) -> None:
        print(result.run_id, flush=True)
        print(f"{result.run_id}: started on {len(result.workers)} worker(s); watching {result.node.name} for "
              "preemption", file=sys.stderr, flush=True)

    managed = await launch_with_recovery(
        providers, args.node, args.config, args.overrides, args.env_file, zones=settings.gcp.zones,
        max_recoveries=3 if args.max_recoveries is None else args.max_recoveries,
        watch_every_s=args.watch_every, python=args.python,
        progress=output.progress, on_launch=launched, before_send=plan_check(args.check_plan),
        notify=Notifier.from_settings(settings, output.progress).notify,
        policy=policy, webhook_url=webhook.get_secret_value() if webhook else None,
    )
    if managed is None:
        print("error: the job did not start on every worker; nothing is left running", file=sys.stderr)
        return 1
    if args.json:
        output.print_json(managed.to_json())
    else:
        table = output.recovery_table(managed)
        if table:
            print(table, file=sys.stderr)
        note = f" ({managed.note})" if managed.note else ""
        print(f"{managed.current.run_id}: {managed.status.lower()}{note}", file=sys.stderr)
    return 0 if managed.status == "SUCCEEDED" else 1


async def _check_managed(args: argparse.Namespace, job: JobSpec | None, policy: SupervisionPolicy,
                         providers: dict[str, Provider], settings: Settings) -> Any:
    """The budgets of a managed launch; refused before anything is launched: a policy that deletes the
    node, a worker subset, the trainer without checkpoints a new node can read, what no controller could
    recover (handover.refuse_unrecoverable), a bad budget."""
    from tpu_console.controller.handover import budgets_of, refuse_unmanageable, refuse_unrecoverable
    from tpu_console.controller.store import open_store
    from tpu_console.experiments.recovery import require_durable_checkpoints
    from tpu_console.providers.registry import find_node

    refuse_unmanageable(policy)
    if args.worker != "all":
        raise UserError("a managed run is relaunched on every worker; leave out --worker")
    provider, _ = await find_node(providers, args.node)
    if job is None:
        require_durable_checkpoints(args.config, args.overrides, provider.name)
    await asyncio.to_thread(refuse_unrecoverable, open_store(settings), provider.name, args.node,
                            job.project_dir() if job is not None else None, args.env_file)
    return budgets_of(job.recovery if job is not None else None, max_recoveries=args.max_recoveries,
                      max_cost=args.max_total_cost, deadline=args.deadline, doctor=args.doctor)


async def _hand_over(args: argparse.Namespace, job: JobSpec | None, policy: SupervisionPolicy, result: Any,
                     settings: Settings, budgets: Any) -> None:
    from tpu_console.controller import relaunch
    from tpu_console.controller.handover import give_env, hand_over
    from tpu_console.controller.lease import read_lease
    from tpu_console.controller.store import open_store
    from tpu_console.launch.job_kinds import validate_config

    spec = (relaunch.job_of_command(job, args.env_file, policy, args.check_code, args.check_ports)
            if job is not None else
            relaunch.job_of_trainer(validate_config(args.config, args.overrides), args.env_file, args.python,
                                    policy, args.check_code, args.check_ports))
    store = open_store(settings)
    run = await asyncio.to_thread(hand_over, store, result, spec, list(settings.gcp.zones), budgets)
    print(f"{result.run_id}: managed as {run.id} (state in {store.place}); up to {budgets.max_recoveries} "
          "recoveries", file=sys.stderr)
    if warning := await give_env(store, run, settings):
        print(f"warning: {warning}", file=sys.stderr)
    if await asyncio.to_thread(read_lease, store) is None:
        print("warning: no controller serves this project yet: start one with `tpu-console controller "
              "start`", file=sys.stderr)


def job_from_args(args: argparse.Namespace) -> JobSpec | None:
    """The command launch runs (`-- CMD`, `--job FILE`), or None for the bundled trainer (`--config`)."""
    command = args.command  # None without `--`; [] for a `--` with nothing after it
    if args.config is not None:
        if args.metrics is not None:
            raise UserError("--metrics says how a command's output gives its steps; the trainer (--config) "
                            "writes its own")
        if command is not None:
            raise UserError("--config launches the bundled trainer and -- COMMAND a program of your own; "
                            "give one of them")
        if args.job is not None:
            raise UserError("--config and --job both name the job; give one of them")
        return None
    if args.overrides:
        raise UserError("--set overrides a key of the trainer's config; it goes with --config FILE")
    if args.job is not None:
        job = load_job_file(args.job, command)
    elif command is None:
        raise UserError("nothing to launch: give --config FILE (the bundled trainer), --job FILE.toml, or "
                        "-- COMMAND ...")
    else:
        job = JobSpec.from_command(command)
    return job.with_metrics(args.metrics) if args.metrics is not None else job


def supervision_policy(args: argparse.Namespace, job: JobSpec | None = None) -> SupervisionPolicy:
    """What the run's supervisor is asked to do, from launch's flags over a job file's [supervisor]
    (one-line errors for bad values)."""
    flags_given = dict(
        fail_fast=args.fail_fast or None, on_end=args.on_end, grace=args.grace, max_cost=args.max_cost,
        price_per_hour=args.price_per_hour, max_hang=args.max_hang, restart_on=args.restart_on,
        max_restarts=args.max_restarts, on_straggler=args.on_straggler,
    )
    if job is not None:
        return job.policy(**flags_given)
    return policy_from_options(**{**flags_given, "fail_fast": args.fail_fast,
                                  "on_end": args.on_end or "keep"})


def describe_policy(policy: SupervisionPolicy) -> str:
    parts = ["fail-fast" if policy.fail_fast else "no fail-fast"]
    if policy.restart_on:
        parts.append(f"restart on {','.join(policy.restart_on)} (up to {policy.max_restarts} each)")
    if policy.on_end == "delete":
        parts.append(f"delete the node {policy.grace_s:g}s after the run ends")
    if policy.max_cost is not None:
        parts.append(f"max cost ${policy.max_cost:g}")
    if policy.max_hang_s is not None:
        parts.append(f"max hang {policy.max_hang_s:g}s")
    if policy.on_straggler:
        parts.append(f"on a straggler: {policy.on_straggler}")
    return ", ".join(parts)


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
    "launch": launch, "runs": runs, "status": status, "logs": logs, "stop": stop, "metrics": metrics,
    "stacks": stacks,
}
