"""`tpu-console launch`: its flags (the job, the checks before it, the supervisor's orders, the recovery
and the controller's hand-over) and the verb itself, the bundled trainer (`--config`) or a command of your
own (`-- COMMAND`, `--job FILE.toml`) on every worker of a node, through launch/start.py."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.launch.job_kinds import ValidatedConfig
from tpu_console.launch.job_spec import JobSpec, load_job_file
from tpu_console.launch.start import launch as launch_run
from tpu_console.observe.notifications import Notifier
from tpu_console.observe.supervision import SupervisionPolicy, policy_from_options
from tpu_console.providers.base import Provider
from tpu_console.settings import Settings
from tpu_console.views import runs as run_table


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
    launch.add_argument("--lost-after", metavar="DURATION",
                        help="with --managed: a node whose workers stay unreachable this long is lost and "
                        "made again (default 10m; over a job file's [recovery] lost_after)")
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
                      max_cost=args.max_total_cost, deadline=args.deadline, lost_after=args.lost_after,
                      doctor=args.doctor)


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


HANDLERS = {"launch": launch}
