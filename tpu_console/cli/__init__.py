"""`tpu-console`: with no arguments, the terminal app; with a verb, the same action for scripts.

Argument parsing and printing only; the verbs themselves live in the layers below. Here: the parser's
frame, `main` and the dispatch. The verbs are declared and handled one group a module (nodes.py, runs.py,
provision.py, experiments.py, app.py); options they share in flags.py; tables and other output in
output.py; questions before destroying something in prompts.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from tpu_console.cli import (
    app,
    controller,
    doctor,
    experiments,
    flags,
    launch,
    nodes,
    output,
    provision,
    runs,
)
from tpu_console.errors import Unreachable, UserError
from tpu_console.history import prep_log
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import build_providers, close_providers
from tpu_console.settings import Settings, load_settings

Handler = Callable[[argparse.Namespace, Settings, dict[str, Provider]], Awaitable[int]]
HANDLERS: dict[str, Handler] = {
    **nodes.HANDLERS, **provision.HANDLERS, **launch.HANDLERS, **runs.HANDLERS, **experiments.HANDLERS,
    **controller.HANDLERS, **doctor.HANDLERS,
}

EXAMPLES = """\
examples:
  tpu-console                                   open the terminal app
  tpu-console ls                                nodes of every configured provider
  tpu-console create pod-a --type local-2x4     a simulated 2-worker pod on this machine
  tpu-console create run-1 --type v6e-16 --zones europe-west4-a,us-east5-b
  tpu-console create run-1 --type v6e-16 --zones auto --race --wait-for 2h
  tpu-console capacity --type v6e-16            what past creates say about each zone
  tpu-console exec pod-a -- hostname            run on every worker
  tpu-console doctor pod-a                      every chip, link and port checked; a fault named with its fix
  tpu-console exec pod-a --worker 1-3 -- 'nvidia-smi || true'
  tpu-console plan --type v6e-16 --config trainer/configs/qwen25_3b_v6e16_bench.yaml
  tpu-console launch pod-a --config trainer/configs/tiny_local.yaml --set steps=2 --env-file .env
  tpu-console launch pod-a --fail-fast -- python -m my_trainer --steps 100   your own program, every worker
  tpu-console launch pod-a --job grpo.toml      a job file: command, project, setup, env, metrics, supervisor
  tpu-console logs RUN_ID --follow              every worker's output, prefixed [i], until the run ends
  tpu-console status RUN_ID                     per-worker state, exit status, latest step metrics
  tpu-console stop RUN_ID --yes
  tpu-console launch pod-a --managed --config F  the controller brings it back after a preemption
  tpu-console controller start                  that controller, as a service on this machine
  tpu-console delete pod-a --yes

exit status: 0 success; 2 bad input or unmet precondition (nothing was changed);
exec: the first non-zero worker status, 255 for a worker whose command did not finish;
launch: 1 when a worker could not start the job; logs --follow: 1 when the run did not succeed;
plan: 1 when the config does not fit, 3 when it cannot be planned here (no libtpu).
"""


def _version() -> str:
    try:
        return version("tpu-console")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    common = flags.common_parent()
    parser = argparse.ArgumentParser(
        prog="tpu-console",
        description="Create Cloud TPU pods (or local simulated ones), run commands on every worker, "
        "and watch training runs. Without a command, opens the terminal app.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tpu-console {_version()}")
    flags.add_settings_flags(parser, default=argparse.SUPPRESS)
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND")
    for group in (nodes, provision, launch, runs, doctor, experiments, controller, app):
        group.add_verbs(verbs, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the command for `exec`, `launch` and `setup`, options included.
    command: list[str] = []
    dashes = "--" in argv
    if dashes:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    args = build_parser().parse_args(runs.with_runs_sub_command(argv))
    if args.verb == "exec":
        args.command = list(args.command) + command
    elif args.verb in ("launch", "setup"):
        args.command = command if dashes else None  # `--` with nothing after it is refused by the verb
    elif command:
        print(f"error: unexpected arguments after --: {' '.join(command)}", file=sys.stderr)
        return 2
    json_mode = getattr(args, "json", False)
    try:
        settings = load_settings(flags.settings_flags(args))
        if args.verb is None:
            return app.open_app(settings)
        if args.verb == "serve":
            return app.serve(args)
        return asyncio.run(_run_verb(args, settings))
    except UserError as exc:
        output.print_error(str(exc), json_mode)
        return exc.exit_status
    except Unreachable as exc:
        output.print_error(f"{exc}; check the node with `tpu-console ls`", json_mode)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `tpu-console ls | head`: the reader went away; stop quietly, as other Unix tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


async def _run_verb(args: argparse.Namespace, settings: Settings) -> int:
    providers = build_providers(settings)
    try:
        work = HANDLERS[args.verb](args, settings, providers)
        if args.verb in prep_log.KINDS:  # create, bootstrap, sync, setup: the time a run's goodput counts
            return await prep_log.timed(getattr(args, "node", None) or getattr(args, "name", None),
                                        args.verb, work, ok=lambda status: status == 0)
        return await work
    finally:
        await close_providers(providers)
