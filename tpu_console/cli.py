"""`tpu-console`: with no arguments, the terminal app; with a verb, the same action for scripts.

Argument parsing and printing only; the verbs themselves live in the layers below.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TextIO

from tpu_console import run_table
from tpu_console.errors import Unreachable, UserError
from tpu_console.fleet.node_exec import ExecOutcome, command_line, exec_on_node
from tpu_console.model import CreateRequest
from tpu_console.node_table import COLUMNS, format_age, format_table, node_record, node_row
from tpu_console.providers.base import Provider
from tpu_console.providers.nodes import create_node, delete_node, list_nodes
from tpu_console.providers.registry import (
    KNOWN_PROVIDERS,
    build_providers,
    close_providers,
    create_provider_name,
)
from tpu_console.runs import control as run_control
from tpu_console.runs.launch import launch as launch_run
from tpu_console.runs.resolve import resolve_run
from tpu_console.runs.store import RunStore
from tpu_console.secrets import SecretMasker
from tpu_console.settings import Settings, load_settings

EXAMPLES = """\
examples:
  tpu-console                                   open the terminal app
  tpu-console ls                                nodes of every configured provider
  tpu-console create pod-a --type local-2x4     a simulated 2-worker pod on this machine
  tpu-console create run-1 --type v6e-16 --zones europe-west4-a,us-east5-b
  tpu-console exec pod-a -- hostname            run on every worker
  tpu-console exec pod-a --worker 1-3 -- 'nvidia-smi || true'
  tpu-console launch pod-a --config trainer/configs/tiny_local.yaml --set steps=2 --env-file .env
  tpu-console logs RUN_ID --follow              every worker's output, prefixed [i], until the run ends
  tpu-console status RUN_ID                     per-worker state, exit status, latest step metrics
  tpu-console stop RUN_ID --yes
  tpu-console delete pod-a --yes

exit status: 0 success; 2 bad input or unmet precondition (nothing was changed);
exec: the first non-zero worker status, 255 for a worker whose command did not finish;
launch: 1 when a worker could not start the job; logs --follow: 1 when the run did not succeed.
"""


def _version() -> str:
    try:
        return version("tpu-console")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    # Options every verb accepts, so they may follow the verb: `tpu-console ls --json`.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout at the end")
    _add_settings_flags(common, default=argparse.SUPPRESS)

    parser = argparse.ArgumentParser(
        prog="tpu-console",
        description="Create Cloud TPU pods (or local simulated ones), run commands on every worker, "
        "and watch training runs. Without a command, opens the terminal app.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tpu-console {_version()}")
    _add_settings_flags(parser, default=argparse.SUPPRESS)
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND")

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
    delete.add_argument("--yes", action="store_true", help="delete without asking")

    run = verbs.add_parser(
        "exec",
        parents=[common],
        help="run a command on a node's workers",
        usage="tpu-console exec NAME [--worker SEL] [--timeout S] [--json] -- COMMAND...",
        description="Run a command on the selected workers at once. Output lines are prefixed by the "
        "worker index ([0] ...); a summary of exit statuses follows on stderr. One argument after -- is a "
        "shell command line as is; several are quoted one by one. Exits with the first non-zero worker "
        "status.",
    )
    run.add_argument("name")
    run.add_argument(
        "--worker",
        default="all",
        metavar="SEL",
        help="workers: all (default), 0, 0,2, 1-3, or a mix such as 0,2-3",
    )
    run.add_argument("--timeout", type=float, metavar="S", help="give up on a worker after S seconds")
    run.add_argument("command", nargs="*", help=argparse.SUPPRESS)
    _add_run_verbs(verbs, common)
    serve = verbs.add_parser(
        "serve", parents=[common], help="the terminal app in a browser tab (textual-serve)",
        description="Serve the terminal app over HTTP: each browser tab gets its own tpu-console session.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8566, help="port (default 8566)")
    return parser


def _add_run_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    launch = verbs.add_parser(
        "launch",
        parents=[common],
        help="start the trainer on every worker of a node",
        description="Validate the config (and --set overrides) here, then start `python -m trainer` "
        "detached on the selected workers, each in ~/tpu-console/runs/RUN_ID/. Prints the run id.",
    )
    launch.add_argument("node")
    launch.add_argument("--config", required=True, metavar="FILE", help="trainer YAML config")
    launch.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set rollout.n=8 (repeatable)",
    )
    launch.add_argument(
        "--env-file", metavar="PATH",
        help="KEY=value secrets (WANDB_API_KEY, HF_TOKEN) uploaded as a 0600 file and sourced by the job",
    )
    launch.add_argument(
        "--worker", default="all", metavar="SEL",
        help="workers: all (default); a subset only on local and ssh pods",
    )
    launch.add_argument(
        "--python", metavar="PY",
        help="interpreter on the workers (default: the environment `bootstrap` made, ~/tpu-console/env; "
        "this interpreter for local pods that were not bootstrapped)",
    )
    launch.add_argument(
        "--kill-stale", action="store_true",
        help="first kill processes still holding the TPU and remove /tmp/libtpu_lockfile on every worker",
    )
    launch.add_argument(
        "--no-code-check", dest="check_code", action="store_false",
        help="launch even if the workers run different code or JAX versions",
    )
    launch.add_argument(
        "--recover", action="store_true",
        help="stay with the run: if the node is preempted, delete and recreate it, bootstrap, sync and "
        "relaunch from the latest checkpoint (needs checkpoint.dir outside the node and "
        "checkpoint.every_steps)",
    )
    launch.add_argument("--max-recoveries", type=int, default=3, metavar="N",
                        help="with --recover (default 3)")
    launch.add_argument("--watch-every", type=float, default=30.0, metavar="S",
                        help="with --recover: seconds between two looks at the node and the run (default 30)")
    launch.add_argument(
        "--fail-fast", action="store_true",
        help="stop the other workers as soon as one worker's job fails (recorded in launch.json)",
    )

    bootstrap = verbs.add_parser(
        "bootstrap", parents=[common], help="install the trainer's Python environment on every worker",
        description="Make ~/tpu-console/env on every worker hold the trainer's dependencies (uv when it can "
        "be installed, else python -m venv and pip; jax[tpu] on TPU VMs, CPU jax elsewhere). Idempotent: a "
        "worker that already has it answers at once. Reports python, jax, jaxlib, libtpu and flax versions.",
    )
    bootstrap.add_argument("node")
    bootstrap.add_argument("--worker", default="all", metavar="SEL", help="workers: all (default), 0, 1-3")
    bootstrap.add_argument("--python", default="python3", metavar="PY",
                           help="base interpreter on the workers, 3.11+ (default python3)")
    bootstrap.add_argument("--jax", choices=("tpu", "cpu"),
                           help="JAX flavour (default: tpu on gcp, else cpu)")
    bootstrap.add_argument("--link", dest="link", action="store_true", default=None,
                           help="use this machine's installed packages through a .pth link (default for pods "
                           "on this machine, such as local pods)")
    bootstrap.add_argument("--no-link", dest="link", action="store_false", help="always install")
    bootstrap.add_argument("--force", action="store_true", help="install again even if in place")

    bench = verbs.add_parser(
        "bench-memory", parents=[common], help="FSDP memory bench on every worker: sharded vs gathered bytes",
        description="For each mesh shape and mode, run `python -m trainer bench-memory` on every worker "
        "(joined by jax.distributed, one case after the other) and print per-device bytes against what FSDP "
        "predicts (total/fsdp sharded, total gathered), with device bytes in use and peak where the "
        "platform reports them.",
    )
    bench.add_argument("node")
    bench.add_argument("--mesh-shape", action="append", metavar="M",
                       help="a mesh shape to try: auto, host_local or dp,fsdp,tp (repeatable; default auto "
                       "and host_local)")
    bench.add_argument("--mode", default="sharded,gather", metavar="MODES", help="sharded, gather or both")
    bench.add_argument("--target-bytes-gib", type=float, default=5.6, metavar="X",
                       help="buffer size in GiB (default 5.6, Qwen2.5-3B in bf16)")
    bench.add_argument("--cols", type=int, default=4096, help="buffer columns (default 4096)")
    bench.add_argument("--python", metavar="PY", help="interpreter on the workers (default as for launch)")

    sweep = verbs.add_parser(
        "sweep", parents=[common], help="find the largest batch that fits in device memory",
        description="Short trial runs (--steps, 2 by default) on every worker at different values of "
        "--param: doubling from the config's value while they fit, then bisecting between the largest fit "
        "and the first RESOURCE_EXHAUSTED. Only values the trainer accepts on this node's shape are tried. "
        "Every trial is a run in `tpu-console runs`; the sweep is kept in $TPU_CONSOLE_HOME/sweeps/.",
    )
    sweep.add_argument("node")
    sweep.add_argument("--config", required=True, metavar="FILE", help="trainer YAML config")
    sweep.add_argument("--param", default="rollout.batch_size",
                       help="rollout.batch_size (default) or rollout.n")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key for every trial (repeatable)")
    sweep.add_argument("--steps", type=int, default=2, help="steps per trial (default 2)")
    sweep.add_argument("--max", dest="limit", type=int, metavar="N",
                       help="largest value to try (default 16x the config's)")
    sweep.add_argument("--env-file", metavar="PATH", help="secrets for the trials, as for launch")
    sweep.add_argument("--python", metavar="PY", help="interpreter on the workers (default as for launch)")

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
    idle.add_argument("--yes", action="store_true", help="with --auto-delete-idle: do not ask")
    idle.add_argument("--watch", type=float, metavar="S",
                      help="check again every S seconds until interrupted")

    metrics = verbs.add_parser(
        "metrics", parents=[common], help="live HBM and duty cycle of every TPU device, from libtpu",
        description="Read libtpu's runtime metrics (HBM in use and total, tensorcore duty cycle) on every "
        "worker, without the trainer and without importing JAX there: they show even while a job hangs. "
        "Workers where nothing reports them (CPU pods) say why.",
    )
    metrics.add_argument("node")
    metrics.add_argument("--worker", default="all", metavar="SEL", help="workers: all (default), 0, 1-3")
    metrics.add_argument("--address", default="localhost:8431",
                         help="libtpu's metrics service on each worker")

    sync = verbs.add_parser(
        "sync", parents=[common], help="install this checkout's code (and .env) on every worker",
        description="Build a wheel of this checkout as it is on disk (uncommitted changes included), upload "
        "it to every worker and install it into ~/tpu-console/env; or with --git URL --branch B, clone/fetch "
        "and install that on every worker. --env-file uploads secrets as ~/tpu-console/.env (mode 0600), "
        "which later launches use when they get no --env-file.",
    )
    sync.add_argument("node")
    sync.add_argument("--worker", default="all", metavar="SEL", help="workers: all (default), 0, 1-3")
    sync.add_argument("--env-file", metavar="PATH", help="KEY=value secrets to upload (mode 0600)")
    sync.add_argument("--git", dest="git_url", metavar="URL", help="clone this repository on the workers")
    sync.add_argument("--branch", metavar="B", help="with --git: the branch or tag to check out")

    runs = verbs.add_parser(
        "runs", parents=[common], help="list launched runs",
        description="Runs launched from this machine, most recent first; unfinished ones are probed now.",
    )
    runs.add_argument("node", nargs="?", help="only this node's runs; or `show`, `compare` (below)")
    runs.add_argument("more", nargs="*", metavar="RUN", help="`runs show RUN` (or NODE [RUN]): one run in "
                      "full; `runs compare RUN_A RUN_B ...`: their summaries side by side, with B vs A in "
                      "percent")
    runs.add_argument("--limit", type=int, default=50, help="at most this many runs (default 50)")

    status = verbs.add_parser(
        "status", parents=[common], help="a run's state on every worker",
        description="Each worker's state, exit status and latest step metrics; the first failure.",
    )
    status.add_argument("target", metavar="NODE|RUN_ID", help="a run id, or a node (its latest run)")
    status.add_argument("run_id", metavar="RUN_ID", nargs="?", help="with a node: one of its runs")

    logs = verbs.add_parser(
        "logs", parents=[common], help="a run's output, prefixed by worker",
        description="The end of each worker's output.log, prefixed [i]; with --follow, new output as it "
        "comes until every worker's job has ended (exit 0 when the run succeeded, else 1).",
    )
    logs.add_argument("target", metavar="NODE|RUN_ID", help="a run id, or a node (its latest run)")
    logs.add_argument("run_id", metavar="RUN_ID", nargs="?", help="with a node: one of its runs")
    logs.add_argument("--worker", default="all", metavar="SEL", help="workers: all (default), 0, 0,2, 1-3")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    logs.add_argument(
        "--lines", "-n", default="50", metavar="N",
        help="start with the last N lines of each worker (default 50; `all` for the whole log)",
    )

    stop = verbs.add_parser(
        "stop", parents=[common], help="stop a run on every worker",
        description="SIGTERM the job's process group on every worker, SIGKILL it after --grace seconds.",
    )
    stop.add_argument("target", metavar="NODE|RUN_ID", help="a run id, or a node (its latest run)")
    stop.add_argument("run_id", metavar="RUN_ID", nargs="?", help="with a node: one of its runs")
    stop.add_argument("--yes", action="store_true", help="stop without asking")
    stop.add_argument("--grace", type=float, default=10.0, metavar="S", help="seconds before SIGKILL (10)")


def _add_settings_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--project", default=default, help="gcp project (overrides gcp.project)")
    parser.add_argument(
        "--internal-ip",
        action="store_true",
        default=default,
        help="reach gcp workers on their internal IPs (from inside the VPC)",
    )


def settings_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that override config.toml and the environment, as a nested settings dict."""
    return {
        "gcp": {"project": getattr(args, "project", None), "internal_ip": getattr(args, "internal_ip", None)}
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the command for `exec`, options included.
    command: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    args = build_parser().parse_args(argv)
    if args.verb == "exec":
        args.command = list(args.command) + command
    elif command:
        print(f"error: unexpected arguments after --: {' '.join(command)}", file=sys.stderr)
        return 2
    json_mode = getattr(args, "json", False)
    try:
        settings = load_settings(settings_flags(args))
        if args.verb is None:
            return _open_app(settings)
        if args.verb == "serve":
            return _serve(args)
        return asyncio.run(_run_verb(args, settings))
    except UserError as exc:
        _print_error(str(exc), json_mode)
        return exc.exit_status
    except Unreachable as exc:
        _print_error(f"{exc}; check the node with `tpu-console ls`", json_mode)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `tpu-console ls | head`: the reader went away; stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _open_app(settings: Settings) -> int:
    from datetime import timedelta

    from tpu_console.tui.app import TpuConsoleApp
    from tpu_console.tui.keymap import check_keymap
    from tpu_console.tui.options import ConsoleOptions

    options = ConsoleOptions(
        default_provider=create_provider_name(settings), zones=list(settings.gcp.zones),
        idle_after=timedelta(minutes=settings.idle_after_minutes),
        sync_env_file=".env" if os.path.isfile(".env") else None,
    )
    keymap = check_keymap(settings.keys)  # before the app takes the terminal: a bad id is one line
    TpuConsoleApp(build_providers(settings), options=options, keymap=keymap).run()
    return 0


def _serve(args: argparse.Namespace) -> int:
    """The same app in a browser tab: textual-serve runs `tpu-console` per browser session."""
    from textual_serve.server import Server

    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "tpu_console"])
    print(f"serving tpu-console at http://{args.host}:{args.port} (Ctrl-C stops)",
          file=sys.stderr, flush=True)
    Server(command, host=args.host, port=args.port, title="tpu-console").serve()
    return 0


async def _run_verb(args: argparse.Namespace, settings: Settings) -> int:
    handlers: dict[str, Callable[[argparse.Namespace, Settings, dict[str, Provider]], Awaitable[int]]] = {
        "ls": _ls,
        "create": _create,
        "delete": _delete,
        "exec": _exec,
        "launch": _launch,
        "bootstrap": _bootstrap,
        "sync": _sync,
        "bench-memory": _bench_memory,
        "sweep": _sweep,
        "idle": _idle,
        "metrics": _metrics,
        "runs": _runs,
        "status": _status,
        "logs": _logs,
        "stop": _stop,
    }
    providers = build_providers(settings)
    try:
        return await handlers[args.verb](args, settings, providers)
    finally:
        await close_providers(providers)


async def _ls(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    listing = await list_nodes(providers, args.provider)
    now = datetime.now(UTC)
    for problem in listing.problems:
        print(f"warning: {problem}", file=sys.stderr)
    if args.json:
        _print_json({"nodes": [node_record(n, now) for n in listing.nodes], "problems": listing.problems})
    elif listing.nodes:
        print(format_table(COLUMNS, [node_row(n, now) for n in listing.nodes]))
    else:
        print("no nodes; create one with `tpu-console create NAME --type TYPE`", file=sys.stderr)
    return 0


async def _create(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
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
    node = await create_node(providers, provider, request, progress=_progress)
    if args.json:
        _print_json({"node": node_record(node, datetime.now(UTC))})
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


async def _delete(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    def confirm(node: Any) -> None:
        if args.yes:
            return
        if args.json or not (sys.stdin.isatty() and sys.stderr.isatty()):
            raise UserError(f"refusing to delete {args.name} without --yes")
        typed = input(
            f"delete {node.provider} node {node.name} ({node.accelerator_type})? type its name to confirm: "
        )
        if typed.strip() != node.name:
            raise UserError(f"refusing to delete {args.name}: the name typed did not match (or pass --yes)")

    node = await delete_node(providers, args.name, progress=_progress, confirm=confirm)
    if args.json:
        _print_json({"deleted": node.name, "provider": node.provider})
    else:
        print(f"deleted {node.name}")
    return 0


async def _exec(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    command = command_line(args.command)
    masker = SecretMasker.for_node(args.name)  # a `cat .env` on a worker shows *** for each value

    def on_line(line: Any) -> None:
        stream = sys.stderr if line.stream == "stderr" else sys.stdout
        print(f"[{line.worker}] {masker.mask(line.text)}", file=stream, flush=True)

    outcome = await exec_on_node(providers, args.name, command, args.worker, timeout=args.timeout,
                                 on_line=None if args.json else on_line)
    if args.json:
        _print_masked_json(
            masker,
            {
                "node": outcome.node.name,
                "command": outcome.command,
                "exit_status": outcome.exit_status,
                "results": [
                    {
                        "worker": r.worker,
                        "exit_status": r.exit_status,
                        "stdout": r.stdout,
                        "stderr": r.stderr,
                        "duration_s": round(r.duration_s, 3),
                        "error": r.error,
                    }
                    for r in outcome.results
                ],
            }
        )
    else:
        _print_exec_summary(outcome, sys.stderr)
    return outcome.exit_status


async def _launch(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    if args.recover:
        return await _launch_with_recovery(args, settings, providers)
    result = await launch_run(
        providers, args.node, args.config, args.overrides, args.env_file, args.worker,
        python=args.python, kill_stale=args.kill_stale, fail_fast=args.fail_fast, check_code=args.check_code,
        progress=_progress, on_worker=_worker_progress,
    )
    if result.ok and args.fail_fast:
        _start_fail_fast_guard(result.run_id, args)
    if args.json:
        _print_json(run_table.launch_record(result))
    else:
        rows = [(f"[{s.worker}]", "started" if s.ok else "failed", str(s.pgid or "-"), s.error or "")
                for s in result.starts]
        print(format_table(("WORKER", "START", "PGID", ""), rows), file=sys.stderr)
        print(result.run_id)
        if result.ok:
            print(f"follow it with `tpu-console logs {result.node.name} --follow`", file=sys.stderr)
        else:
            print("error: the job did not start on every worker; nothing is left running", file=sys.stderr)
    return 0 if result.ok else 1


async def _launch_with_recovery(
    args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]
) -> int:
    from tpu_console.experiments.recovery import launch_with_recovery

    if args.worker != "all":
        raise UserError("--recover relaunches on every worker; leave out --worker")

    def launched(result: Any) -> None:
        print(result.run_id, flush=True)
        print(f"{result.run_id}: started on {len(result.workers)} worker(s); watching {result.node.name} for "
              "preemption", file=sys.stderr, flush=True)

    log = await launch_with_recovery(
        providers, args.node, args.config, args.overrides, args.env_file, zones=settings.gcp.zones,
        max_recoveries=args.max_recoveries, watch_every_s=args.watch_every, python=args.python,
        progress=_progress, on_launch=launched,
    )
    if args.json:
        _print_json(log.to_json())
    else:
        rows = [(r.at, r.reason, r.old_run_id, r.new_run_id or "-", str(r.last_step_before or "-"),
                 str(r.resumed_step if r.resumed_step is not None else "-"),
                 str(r.steps_lost if r.steps_lost is not None else "-")) for r in log.recoveries]
        if rows:
            print(format_table(("AT", "WHY", "RUN", "NEW RUN", "LAST STEP", "RESUMED AFTER", "LOST"), rows),
                  file=sys.stderr)
        gave_up = f" ({log.gave_up})" if log.gave_up else ""
        print(f"{log.runs[-1]}: {log.final_state}{gave_up}", file=sys.stderr)
    return 0 if log.final_state == "succeeded" else 1


async def _idle(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from datetime import timedelta

    from tpu_console.runs.idle import find_idle

    minutes = args.after or settings.idle_after_minutes
    if minutes < 1:
        raise UserError("--after must be at least 1 minute")
    if args.auto_delete_idle and not args.yes and (args.json or not sys.stdin.isatty()):
        raise UserError("refusing to delete idle nodes without --yes")
    while True:
        listing = await list_nodes(providers)
        runs = await run_control.list_runs(providers, limit=500)  # unfinished runs are probed now
        now = datetime.now(UTC)
        idle = find_idle(listing.nodes, [v.record for v in runs], now, timedelta(minutes=minutes))
        if args.json:
            _print_json({"idle_after_minutes": minutes, "idle": [
                {"node": i.node.name, "provider": i.node.provider, "idle_since": i.idle_since.isoformat(),
                 "idle_minutes": round(i.idle_for.total_seconds() / 60, 1),
                 "cost_while_idle": i.cost_while_idle, "cost_so_far": i.cost_so_far} for i in idle]})
        elif idle:
            print(format_table(("NODE", "PROVIDER", "IDLE SINCE", "IDLE FOR", "COST IDLE", "COST IN ALL"), [
                (i.node.name, i.node.provider, f"{i.idle_since:%Y-%m-%d %H:%M}",
                 format_age(i.idle_since, now),
                 "-" if i.cost_while_idle is None else f"~${i.cost_while_idle:,.2f}",
                 "-" if i.cost_so_far is None else f"~${i.cost_so_far:,.0f}") for i in idle]))
        else:
            print(f"no node has been idle for {minutes} min", file=sys.stderr)
        for item in idle if args.auto_delete_idle else []:
            answer = "yes" if args.yes else input(f"delete idle node {item.node.name}? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                continue
            await delete_node(providers, item.node.name, progress=_progress)
            print(f"deleted {item.describe()}", file=sys.stderr)
        if args.watch is None:
            return 0
        await asyncio.sleep(args.watch)


def _start_fail_fast_guard(run_id: str, args: argparse.Namespace) -> None:
    from tpu_console.runs.guard import guard_log, start_guard

    pid = start_guard(run_id, settings_flags(args))
    print(f"{run_id}: fail-fast watcher started (pid {pid}, log {guard_log(run_id)})", file=sys.stderr)


async def _metrics(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.fleet.fleet import Fleet
    from tpu_console.fleet.preflight import open_node, require_all_reachable
    from tpu_console.fleet.selection import parse_worker_selection
    from tpu_console.runs.device_metrics import read_device_metrics
    from tpu_console.runs.launch import inspect_workers, worker_python

    provider, node = await open_node(providers, args.node)
    workers = parse_worker_selection(args.worker, node.shape.workers)
    async with Fleet(await provider.ssh_targets(node)) as fleet:
        await require_all_reachable(fleet, args.node, workers, "nothing was read")
        reports = await inspect_workers(fleet, workers)
        python = worker_python(provider, reports)
        answers = await read_device_metrics(fleet, workers, python, args.address)
    if args.json:
        _print_json({"node": node.name, "workers": [
            {"worker": a.worker, "not_reported": a.not_reported,
             "devices": [vars(d) for d in a.devices]} for a in answers]})
        return 0
    gib = float(1 << 30)
    rows = []
    for answer in answers:
        if answer.not_reported:
            rows.append((f"[{answer.worker}]", "-", "not reported", "-", answer.not_reported))
        for d in answer.devices:
            used = "-" if d.hbm_used_bytes is None else f"{d.hbm_used_bytes / gib:.1f}"
            total = "-" if d.hbm_total_bytes is None else f"{d.hbm_total_bytes / gib:.1f}"
            share = f" ({d.hbm_fraction:.0%})" if d.hbm_fraction is not None else ""
            duty = "-" if d.duty_cycle_pct is None else f"{d.duty_cycle_pct:.0f}%"
            warn = "near the limit" if d.hbm_fraction is not None and d.hbm_fraction >= 0.9 else ""
            rows.append((f"[{answer.worker}]", str(d.device), f"{used}/{total} GiB{share}", duty, warn))
    print(format_table(("WORKER", "DEVICE", "HBM", "DUTY", ""), rows))
    return 0


async def _bootstrap(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.provision.bootstrap import bootstrap_node

    result = await bootstrap_node(
        providers, args.node, workers=args.worker, python=args.python, jax=args.jax, link=args.link,
        force=args.force, progress=_progress, on_worker=_worker_progress,
    )
    return _print_setup(result, args.json)


async def _sync(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.provision.code_sync import sync_node

    result = await sync_node(
        providers, args.node, workers=args.worker, env_file=args.env_file, git_url=args.git_url,
        branch=args.branch, progress=_progress, on_worker=_worker_progress,
    )
    return _print_setup(result, args.json)


async def _bench_memory(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.experiments import memory_bench

    shapes = [m.strip() for m in args.mesh_shape or ("auto", "host_local")]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    results = await memory_bench.bench_memory(
        providers, args.node, shapes, modes, args.target_bytes_gib, args.cols, python=args.python,
        progress=_progress,
    )
    if args.json:
        _print_json({"node": args.node, "cases": [
            {"mesh_shape": r.mesh_shape, "mode": r.mode, "ok": r.ok, "error": r.error, "bench": r.bench,
             "matches_prediction": r.matches_prediction} for r in results]})
    else:
        print(format_table(memory_bench.COLUMNS, memory_bench.table_rows(results)))
    return 0 if all(r.ok for r in results) else 1


async def _sweep(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.experiments import batch_sweep

    if args.steps < 1:
        raise UserError("--steps must be at least 1")
    result = await batch_sweep.sweep(
        providers, args.node, args.config, args.param, args.overrides, steps=args.steps, limit=args.limit,
        env_file=args.env_file, python=args.python, progress=_progress,
    )
    if args.json:
        _print_json(result.to_json())
        return 0 if result.stopped is None else 1
    rows = [(str(t.value), str(t.local_batch), t.outcome, "-" if t.peak_gib is None else f"{t.peak_gib:.2f}",
             t.run_id or "-") for t in result.trials]
    print(format_table((args.param.upper(), "LOCAL BATCH", "OUTCOME", "PEAK GiB", "RUN"), rows))
    largest = result.largest_fit if result.largest_fit is not None else "none"
    first_oom = result.first_oom if result.first_oom is not None else "none found"
    print(f"largest that fits: {args.param}={largest}; first that does not: {first_oom}")
    if result.stopped:
        print(f"stopped: {result.stopped}", file=sys.stderr)
    return 0 if result.stopped is None else 1


def _print_setup(result: Any, json_mode: bool) -> int:
    """The per-worker table of bootstrap and sync; exit status 1 when a worker failed."""
    if json_mode:
        _print_json({"node": result.node.name, "ok": result.ok, "workers": [
            {"worker": w.worker, "ok": w.ok, "error": w.error, "seconds": round(w.seconds, 2),
             "ready": w.report.ready, "versions": w.versions, "code": w.report.code}
            for w in result.workers]})
    else:
        rows = [(f"[{w.worker}]", "ok" if w.ok else "FAILED", w.code,
                 w.report.versions_label() if w.ok else (w.error or ""), f"{w.seconds:.1f}s")
                for w in result.workers]
        print(format_table(("WORKER", "", "CODE", "VERSIONS", "TIME"), rows))
    return 0 if result.ok else 1


def _worker_progress(worker: int, text: str) -> None:
    print(f"[{worker}] {text}", file=sys.stderr, flush=True)


async def _runs(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    if args.node in ("show", "compare"):
        from tpu_console import run_history_cli  # `runs show` and `runs compare` live there

        handler = run_history_cli.show if args.node == "show" else run_history_cli.compare
        return await handler(args.more, args.json, providers)
    if args.more:
        raise UserError(f"unexpected arguments after {args.node}: {' '.join(args.more)}; "
                        "use `runs NODE`, `runs show RUN` or `runs compare RUN_A RUN_B`")
    views = await run_control.list_runs(providers, args.node, limit=args.limit)
    if args.json:
        _print_json({"runs": [run_table.run_record(v) for v in views]})
    elif views:
        now = datetime.now(UTC)
        print(format_table(run_table.RUN_COLUMNS, [run_table.run_row(v, now) for v in views]))
    else:
        print("no runs yet; start one with `tpu-console launch NODE --config FILE`", file=sys.stderr)
    return 0


async def _status(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    record = await resolve_run(RunStore(), providers, args.target, args.run_id)
    view = await run_control.run_status(providers, record.run_id)
    masker = SecretMasker.for_node(record.node)  # notes quote worker output, which may hold a leaked value
    if args.json:
        print(masker.mask(json.dumps(run_table.run_record(view), indent=2)))
        return 0
    record = view.record
    age = format_age(record.started_at, datetime.now(UTC))
    print(f"{record.run_id}  {record.node} ({record.provider} {record.accelerator_type})  {view.state}  "
          f"started {age} ago")
    worker_rows = [run_table.worker_row(s) for s in view.workers]
    print(masker.mask(format_table(run_table.WORKER_COLUMNS, worker_rows)))
    if view.failure:
        print(masker.mask(f"failed first: {view.failure}"))
    if view.state == "partially-dead":
        alive = [str(s.worker) for s in view.workers if not s.done]
        print(f"workers {','.join(alive)} still run after that failure and will likely hang; stop them with "
              f"`tpu-console stop {record.node} {record.run_id}`")
    if view.problem:
        print(f"note: {view.problem}", file=sys.stderr)
    return 0


async def _logs(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    lines = _parse_lines(args.lines)
    collected: list[dict[str, Any]] = []

    def on_line(worker: int, text: str) -> None:
        text = masker.mask(text)
        if args.json:
            collected.append({"worker": worker, "text": text})
        else:
            print(f"[{worker}] {text}", flush=True)

    record = await resolve_run(RunStore(), providers, args.target, args.run_id)
    masker = SecretMasker.for_node(record.node)  # a value a job printed is shown as ***
    view = await run_control.logs(
        providers, record.run_id, on_line, workers=args.worker, lines=lines, follow=args.follow
    )
    if args.json:
        _print_json({"run_id": view.record.run_id, "state": view.state, "failure": view.failure,
                     "lines": collected})
    elif args.follow:
        print(f"{view.record.run_id}: {view.state}" + (f": {view.failure}" if view.failure else ""),
              file=sys.stderr)
    if args.follow:
        return 0 if view.state == "succeeded" else 1
    return 0


def _parse_lines(text: str) -> int | None:
    if text.strip().lower() == "all":
        return None
    try:
        lines = int(text)
    except ValueError:
        raise UserError(f"--lines {text!r} is not a number; give a count like 100, or all") from None
    if lines < 0:
        raise UserError(f"--lines {lines} is negative; give a count like 100, or all")
    return lines


async def _stop(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    record = await resolve_run(RunStore(), providers, args.target, args.run_id)
    if not args.yes:
        if args.json or not (sys.stdin.isatty() and sys.stderr.isatty()):
            raise UserError(f"refusing to stop {record.run_id} without --yes")
        answer = input(f"stop run {record.run_id} on {record.node} (workers {record.workers})? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise UserError(f"not stopping {record.run_id}")
    view, stops = await run_control.stop(providers, record.run_id, grace_s=args.grace)
    unreachable = [s for s in stops if s.outcome == "unreachable"]
    if args.json:
        _print_json({"run_id": record.run_id, "state": view.state,
                     "workers": [run_table.stop_record(s) for s in stops]})
    else:
        rows = [(f"[{s.worker}]", s.outcome, s.signal or "-",
                 "-" if s.exit_status is None else str(s.exit_status), s.error or "") for s in stops]
        print(format_table(("WORKER", "OUTCOME", "SIGNAL", "EXIT", ""), rows), file=sys.stderr)
        print(f"{record.run_id}: {view.state}")
    return 1 if unreachable else 0


def _print_exec_summary(outcome: ExecOutcome, out: TextIO) -> None:
    rows = []
    for r in outcome.results:
        if r.error is not None or r.exit_status is None:
            rows.append((f"[{r.worker}]", "-", f"{r.duration_s:.2f}s", r.error or "did not finish"))
        else:
            rows.append(
                (f"[{r.worker}]", str(r.exit_status), f"{r.duration_s:.2f}s", "ok" if r.ok else "failed")
            )
    print(format_table(("WORKER", "EXIT", "TIME", ""), rows), file=out)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _print_masked_json(masker: SecretMasker, document: dict[str, Any]) -> None:
    print(masker.mask(json.dumps(document, indent=2)))


def _print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2))


def _print_error(message: str, json_mode: bool) -> None:
    print(f"error: {message}", file=sys.stderr)
    if json_mode:
        _print_json({"error": message})
