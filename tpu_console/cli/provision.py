"""Verbs that make workers ready or run on them: `bootstrap`, `sync`, `demo`, `exec`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.fleet.node_exec import command_line, exec_on_node
from tpu_console.providers.base import Provider
from tpu_console.secrets import SecretMasker
from tpu_console.settings import Settings


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    bootstrap = verbs.add_parser(
        "bootstrap", parents=[common], help="install the trainer's Python environment on every worker",
        description="Make ~/tpu-console/env on every worker hold the trainer's dependencies (uv when it can "
        "be installed, else python -m venv and pip; jax[tpu] on TPU VMs, CPU jax elsewhere), plus py-spy. "
        "The base Python: the image's python3 when new enough, else a python3.1x already there, else one "
        "`uv python install` downloads ([workers] python_install_mirror for closed networks); recorded in "
        "~/tpu-console/python.json. Idempotent: a worker that already has it answers at once. Reports "
        "python, jax, jaxlib, libtpu and flax versions.",
    )
    bootstrap.add_argument("node")
    flags.add_worker(bootstrap)
    flags.add_python(bootstrap, "use this interpreter on the workers as is (default: find or install one)")
    bootstrap.add_argument("--python-version", metavar="X.Y",
                           help="the Python the environment needs, this or newer (default: [workers] python "
                           "in config.toml, 3.11)")
    bootstrap.add_argument("--jax", choices=("tpu", "cpu"),
                           help="JAX flavour (default: tpu on gcp, else cpu)")
    bootstrap.add_argument("--link", dest="link", action="store_true", default=None,
                           help="use this machine's installed packages through a .pth link (default for pods "
                           "on this machine, such as local pods)")
    bootstrap.add_argument("--no-link", dest="link", action="store_false", help="always install")
    bootstrap.add_argument("--force", action="store_true", help="install again even if in place")

    sync = verbs.add_parser(
        "sync", parents=[common], help="install this checkout's code (and .env) on every worker",
        description="Build a wheel of this checkout as it is on disk (uncommitted changes included), upload "
        "it to every worker and install it into ~/tpu-console/env; or with --git URL --branch B, clone/fetch "
        "and install that on every worker. --env-file uploads secrets as ~/tpu-console/.env (mode 0600), "
        "which later launches use when they get no --env-file.",
    )
    sync.add_argument("node")
    flags.add_worker(sync)
    flags.add_env_file(sync, "KEY=value secrets to upload (mode 0600)")
    sync.add_argument("--git", dest="git_url", metavar="URL", help="clone this repository on the workers")
    sync.add_argument("--branch", metavar="B", help="with --git: the branch or tag to check out")

    demo = verbs.add_parser(
        "demo", parents=[common], help="make the offline demo's tiny model and data on every worker",
        description="Make what trainer/configs/tiny_local.yaml reads on every worker that lacks it: a tiny "
        "random Qwen2 at its model_path (~/tiny-qwen2) and synthetic GSM8K-format problems at its data.path "
        "(~/gsm8k-synthetic.jsonl), by the trainer installed on the workers (after bootstrap and sync). "
        "What is there already is left alone. --config/--set name other paths.",
    )
    demo.add_argument("node")
    demo.add_argument("--config", metavar="FILE", help="trainer YAML config (default tiny_local.yaml)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a config key, as for launch (repeatable)")
    flags.add_python(demo)

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
    flags.add_worker(run)
    run.add_argument("--timeout", type=float, metavar="S", help="give up on a worker after S seconds")
    run.add_argument("command", nargs="*", help=argparse.SUPPRESS)


async def bootstrap(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.provision.bootstrap import bootstrap_node

    result = await bootstrap_node(
        providers, args.node, workers=args.worker, python=args.python, python_version=args.python_version,
        install_mirror=settings.workers.python_install_mirror, jax=args.jax, link=args.link,
        force=args.force, progress=output.progress, on_worker=output.worker_progress,
    )
    return output.print_setup(result, args.json)


async def sync(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.provision.code_sync import sync_node

    result = await sync_node(
        providers, args.node, workers=args.worker, env_file=args.env_file, git_url=args.git_url,
        branch=args.branch, progress=output.progress, on_worker=output.worker_progress,
    )
    return output.print_setup(result, args.json)


async def demo(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.runs.demo import make_tiny_inputs

    result = await make_tiny_inputs(
        providers, args.node, args.config, args.overrides, python=args.python, progress=output.progress,
        on_worker=output.worker_progress,
    )
    return output.print_demo(result, args.json)


async def exec_(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    command = command_line(args.command)
    masker = SecretMasker.for_node(args.name)  # a `cat .env` on a worker shows *** for each value

    def on_line(line: Any) -> None:
        stream = sys.stderr if line.stream == "stderr" else sys.stdout
        print(f"[{line.worker}] {masker.mask(line.text)}", file=stream, flush=True)

    outcome = await exec_on_node(providers, args.name, command, args.worker, timeout=args.timeout,
                                 on_line=None if args.json else on_line)
    if args.json:
        output.print_masked_json(
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
        output.print_exec_summary(outcome, sys.stderr)
    return outcome.exit_status


HANDLERS = {"bootstrap": bootstrap, "sync": sync, "demo": demo, "exec": exec_}
