"""Verbs that make workers ready or run on them: `bootstrap`, `sync`, `setup`, `demo`, `exec`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.fleet.node_exec import command_line, exec_on_node
from tpu_console.providers.base import Provider
from tpu_console.secrets import SecretMasker
from tpu_console.settings import Settings
from tpu_console.views.nodes import format_table


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
        "sync", parents=[common], help="put this checkout's code, or your project's, on every worker",
        description="Without --dir/--git: build a wheel of this checkout as it is on disk (uncommitted "
        "changes included), upload it to every worker and install it into ~/tpu-console/env (the bundled "
        "trainer). --dir PATH: your project's files (what git tracks plus untracked files it does not "
        "ignore; outside a repository every file a .gitignore does not name), packed here once and unpacked "
        "on every worker into ~/tpu-console/projects/<digest>/; a worker that has it already gets nothing "
        "(one round trip). "
        "--git URL --branch B: every worker clones that commit into ~/tpu-console/projects/<sha>/. Both make "
        "it the current project (project.json), where `setup` and `launch -- CMD` run. --env-file uploads "
        "secrets as ~/tpu-console/.env (mode 0600), which later launches use when they get no --env-file.",
    )
    sync.add_argument("node")
    flags.add_worker(sync)
    flags.add_env_file(sync, "KEY=value secrets to upload (mode 0600)")
    sync.add_argument("--dir", dest="directory", metavar="PATH",
                      help="your project's folder, sent to every worker")
    sync.add_argument("--git", dest="git_url", metavar="URL", help="clone this repository on the workers")
    sync.add_argument("--branch", metavar="B", help="with --git: the branch or tag to check out")

    setup = verbs.add_parser(
        "setup", parents=[common], help="your project's environment on every worker (pip install, uv sync)",
        usage="tpu-console setup NODE [--requirements F ...] [--python-version X.Y] [--worker SEL] [--json] "
        "-- CMD...",
        description="Run CMD (pip install -r requirements-tpu.txt, uv sync, pip install -e ., anything) on "
        "every worker at once, in the current project's folder (sync --dir/--git), inside a venv "
        "~/tpu-console/envs/<digest>/ made from the Python bootstrap chose, which sees bootstrap's packages "
        "(JAX for the machine). The digest is that of CMD, the requirement files' contents, the Python "
        "version and bootstrap's environment: CMD runs again only when they change, or when it installed "
        "the project and another was synced since (else \"already in place\"). setup.json records a setup "
        "that succeeded; launch runs jobs in it. A worker that fails is named with its last line (exit 2).",
    )
    setup.add_argument("node")
    flags.add_worker(setup)
    setup.add_argument("--requirements", action="append", default=[], metavar="F",
                       help="a file of the project whose content keys the environment (repeatable; default: "
                       "those of requirements.txt, requirements-tpu.txt, pyproject.toml, uv.lock, setup.py, "
                       "setup.cfg, poetry.lock it has)")
    setup.add_argument("--python-version", metavar="X.Y",
                       help="the environment's Python, this or newer (default: the one bootstrap chose)")

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

    if args.directory is not None or args.git_url is not None:
        from tpu_console.provision.project_sync import sync_project

        result = await sync_project(
            providers, args.node, directory=args.directory, git_url=args.git_url, branch=args.branch,
            workers=args.worker, env_file=args.env_file, progress=output.progress,
            on_worker=output.worker_progress,
        )
        return print_project_steps(result, "project", args.json)
    result = await sync_node(
        providers, args.node, workers=args.worker, env_file=args.env_file, git_url=args.git_url,
        branch=args.branch, progress=output.progress, on_worker=output.worker_progress,
    )
    return output.print_setup(result, args.json)


async def setup(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.errors import UserError
    from tpu_console.provision.project_setup import setup_failure, setup_project

    if args.command is None:
        raise UserError(
            "put the setup command after --: tpu-console setup NODE -- pip install -r requirements.txt"
        )
    result = await setup_project(
        providers, args.node, command=args.command, requirements=args.requirements,
        python_version=args.python_version, workers=args.worker, progress=output.progress,
        on_worker=output.worker_progress,
    )
    failure = setup_failure(result)
    error = (f"setup failed on {failure}; fix it and run setup again (launch refuses a mixed pod)"
             if failure else None)
    print_project_steps(result, "setup", args.json, error)
    if error:
        # the error is part of the one JSON document printed above: only its line goes to stderr
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def print_project_steps(result: Any, what: str, json_mode: bool, error: str | None = None) -> int:
    """Per worker: ok or FAILED, the project (or setup) it now has, how it got there; exit 1 on a failure.
    With --json, one document, `error` in it when given."""
    def record(w: Any) -> dict[str, Any] | None:
        return w.report.project if what == "project" else w.report.setup

    if json_mode:
        document: dict[str, Any] = {"node": result.node.name, "ok": result.ok, "workers": [
            {"worker": w.worker, "ok": w.ok, "error": w.error, "seconds": round(w.seconds, 2),
             "ready": w.report.ready, what: record(w), "versions": w.versions, "code": w.report.code}
            for w in result.workers]}
        if error is not None:
            document["error"] = error
        output.print_json(document)
    else:
        rows = []
        for w in result.workers:
            got = record(w) or {}
            label = (f"{got.get('name')} {str(got.get('digest'))[:16]}" if what == "project"
                     else f"~/{got.get('env')}") if got else "-"
            state = {"already": "already in place", "installed": "installed", "unpacked": "unpacked",
                     "cloned": "cloned"}.get(
                w.report.ready or "", w.report.ready or "")
            rows.append((f"[{w.worker}]", "ok" if w.ok else "FAILED", label,
                         state if w.ok else (w.error or ""), f"{w.seconds:.1f}s"))
        print(format_table(("WORKER", "", what.upper(), "", "TIME"), rows))
    return 0 if result.ok else 1


async def demo(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.launch.demo import make_tiny_inputs

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


HANDLERS = {"bootstrap": bootstrap, "sync": sync, "setup": setup, "demo": demo, "exec": exec_}
