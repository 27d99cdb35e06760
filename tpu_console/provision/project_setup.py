"""`tpu-console setup NODE [--requirements F ...] [--python-version X.Y] -- CMD...`: your project's
environment on every worker, in parallel.

CMD (`pip install -r requirements-tpu.txt`, `uv sync`, `pip install -e .`, anything) runs in the current
project's folder (`sync --dir` / `--git`) inside a venv `~/tpu-console/envs/<digest>/` made from the
Python bootstrap chose and seeing bootstrap's packages, the digest being that of CMD, the requirement
files' contents, the Python version and bootstrap's environment: it runs again only when one of them
changes, or when CMD installed the project and another has been synced since. The worker's side is
worker_setup.py; `setup.json` records a setup that succeeded, and launch reads it (`stale_setup`). A
worker that fails is named with its last line.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from importlib import resources
from typing import Any

from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.providers.base import Progress, Provider, no_progress
from tpu_console.provision import worker_setup
from tpu_console.provision.bootstrap import checked_python_version
from tpu_console.provision.project_sync import synced_file_hashes
from tpu_console.provision.steps import OnWorker, SetupResult, ignore_worker, run_on_workers
from tpu_console.provision.worker_recipes import PYTHON_FILE, _home

SETUP_TIMEOUT_S = 3600.0  # a first `pip install -r` of a JAX project downloads gigabytes


def setup_command_text(command: str | Sequence[str]) -> str:
    """One shell command line: a string as is, one argument as is, several quoted one by one (as `exec`)."""
    if isinstance(command, str):
        text = command
    else:
        text = command[0] if len(command) == 1 else shlex.join(command)
    if not text.strip():
        raise UserError(
            "setup needs a command after --: tpu-console setup NODE -- pip install -r requirements.txt"
        )
    return text


def setup_recipe(
    command: str, requirements: Sequence[str], python_version: str | None, node: str = "NODE"
) -> tuple[str, str]:
    """The command (bootstrap's interpreter from python.json, running worker_setup.py from stdin) and its
    stdin."""
    args = ["--command", command, "--node", node]
    for requirement in requirements:
        args += ["--requirement", requirement]
    if python_version:
        args += ["--python-version", python_version]
    no_python = f"@@ error no python.json on this worker; run `tpu-console bootstrap {node}` first"
    read_python = (
        f"py=$(sed -n 's/.*\"python\": *\"\\([^\"]*\\)\".*/\\1/p' {_home(PYTHON_FILE)} 2>/dev/null)\n"
        f'[ -n "$py" ] && [ -x "$py" ] || '
        f"{{ echo {shlex.quote(no_python)}; exit {worker_setup.NO_PYTHON}; }}\n"
    )
    script = resources.files("tpu_console.provision").joinpath("worker_setup.py").read_text()
    return read_python + 'exec "$py" - ' + " ".join(shlex.quote(a) for a in args), script


def setup_failure(result: SetupResult) -> str | None:
    """`worker 2: <its last line>` for the first worker that failed, or None."""
    for setup in result.workers:
        if not setup.ok:
            return f"worker {setup.worker}: {setup.error}"
    return None


async def setup_project(
    providers: dict[str, Provider],
    node_name: str,
    *,
    command: str | Sequence[str],
    requirements: Sequence[str] = (),
    python_version: str | None = None,
    workers: str = "all",
    progress: Progress = no_progress,
    on_worker: OnWorker = ignore_worker,
) -> SetupResult:
    """Run the setup on the selected workers at once; `report.setup` of each is its setup.json. Bad input
    (no command, a requirement file the project lacks, no project synced, a Python no worker can get)
    raises UserError; a command that fails leaves `ok` False, `setup_failure` names the worker."""
    text = setup_command_text(command)
    version = checked_python_version(python_version) if python_version else None
    for requirement in requirements:
        if requirement.startswith("/") or ".." in requirement.split("/"):
            raise UserError(
                f"--requirements {requirement}: give a file inside the project, relative to its folder"
            )
    provider, node = await open_node(providers, node_name)
    selected = parse_worker_selection(workers, node.shape.workers)
    recipe, script = setup_recipe(text, requirements, version, node.name)
    async with Fleet(await provider.ssh_targets(node)) as fleet:
        await require_all_reachable(fleet, node_name, selected, "nothing was set up")
        progress(f"{node.name}: setting up {len(selected)} worker(s): {text}")
        setups = await run_on_workers(
            fleet, recipe, selected, stdin=script, timeout=SETUP_TIMEOUT_S, on_worker=on_worker
        )
    refused = [s for s in setups if not s.ok and s.report.error and _bad_input(s.report.error)]
    if refused:
        raise UserError(f"worker {refused[0].worker}: {refused[0].report.error}")
    return SetupResult(node, setups)


def _bad_input(error: str) -> bool:
    refusals = ("no project on", "no Python", "no python.json")
    return error.startswith(refusals) or " is not in the project " in error or " still runs in ~/" in error


def stale_requirements(
    node_name: str, project: dict[str, Any] | None, setup: dict[str, Any] | None
) -> str | None:
    """Why a command may not run in the workers' setup environment now, or None: a requirement file it was
    made from (setup.json's requirements, by sha256) differs in the project synced since, as this console
    synced it (`--dir`; nothing is known here of a project another console or `--git` put there)."""
    if not project or not setup or setup.get("project_digest") == project.get("digest"):
        return None
    hashes = synced_file_hashes(node_name, project.get("digest"))
    made_from = setup.get("requirements") or {}
    if hashes is None:
        return None
    # gone from the project, or another content (a symlink's content is not known here: taken as it is)
    changed = [name for name, sha in made_from.items()
               if name not in hashes or hashes[name] not in (sha, None)]
    if not changed:
        return None
    return (f"the setup environment on {node_name} was made from {changed[0]} as it was before the project "
            f"synced since changed it; run `tpu-console setup {node_name} -- {setup.get('command')}` again, "
            "then launch")


def stale_setup(node_name: str, project: dict[str, Any] | None, setup: dict[str, Any] | None) -> str | None:
    """Why a command may not run in the workers' setup environment now, or None: its command installed
    the project (setup.json's holds_project) and the project synced since is another one, whose code the
    job would not run. Launch refuses rather than run the setup itself: a setup runs any command, for
    minutes, and `launch -- CMD` changes no environment on its own (a job file's [setup] is how to ask)."""
    if not project or not setup or not setup.get("holds_project"):
        return None
    installed, synced = str(setup.get("project_digest"))[:16], str(project.get("digest"))[:16]
    if installed == synced:
        return None
    command = setup.get("command")
    named = f"{project['name']} {synced}" if project.get("name") else synced
    return (f"the setup environment on {node_name} holds the project {installed} that `{command}` installed, "
            f"not {named} synced since; run `tpu-console setup {node_name} -- {command}` again to install "
            "it, then launch")
