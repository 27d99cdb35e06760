"""`tpu-console bootstrap NODE`: give every worker the trainer's Python environment, in parallel.

What one does by hand on each worker (install Python, make an environment, pip install JAX and the
rest), done once per node and idempotently: a worker whose environment already holds exactly what this
bootstrap would install answers "already in place" in about a second. Each worker reports the versions it
ended with (python, jax, jaxlib, libtpu, flax), read without importing JAX. See docs/workers.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import ValidationError

from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.providers.base import Progress, Provider, no_progress
from tpu_console.provision import worker_recipes
from tpu_console.provision.requirements import JaxFlavour, environment_digest, trainer_requirements
from tpu_console.provision.steps import (
    OnWorker,
    SetupResult,
    console_site_packages,
    ignore_worker,
    run_on_workers,
    shares_console_machine,
)
from tpu_console.settings import WorkersSettings, load_settings

BOOTSTRAP_TIMEOUT_S = 1800.0  # a first jax[tpu] install downloads about a gigabyte
NO_PYTHON = "no Python"  # how bootstrap.sh's error begins when a worker cannot get the Python asked for


def console_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def checked_python_version(version: str) -> str:
    """`version` as `[workers] python` takes it ("3.12"), or a one-line UserError."""
    try:
        return WorkersSettings(python=version).python
    except ValidationError:
        raise UserError(
            f"--python-version {version!r} is not a Python the workers can use; give 3.11 or later, e.g. 3.12"
        ) from None


async def bootstrap_node(
    providers: dict[str, Provider],
    node_name: str,
    *,
    workers: str = "all",
    python: str | None = None,
    python_version: str | None = None,
    install_mirror: str | None = None,
    jax: JaxFlavour | None = None,
    link: bool | None = None,
    force: bool = False,
    progress: Progress = no_progress,
    on_worker: OnWorker = ignore_worker,
) -> SetupResult:
    """Make `~/tpu-console/env` on the selected workers hold the trainer's dependencies.

    `python`: the workers' base interpreter, used as is; by default bootstrap finds one of
    `python_version` or newer (`[workers] python` in config.toml), or has uv install it, from
    `install_mirror` (`[workers] python_install_mirror`, else this machine's UV_PYTHON_INSTALL_MIRROR).
    `jax`: "tpu" (jax[tpu], with libtpu) or "cpu"; by default tpu on gcp nodes, cpu elsewhere.
    `link`: see the console's own packages instead of installing (default: when the pod shares the
    console's machine, as local pods do); such an environment is made from the console's Python version.
    """
    if python is not None and not python.strip():
        raise UserError("--python is empty; give the workers' base interpreter, e.g. --python python3")
    configured = load_settings().workers
    version = checked_python_version(python_version or configured.python)
    mirror = install_mirror or configured.python_install_mirror or os.environ.get("UV_PYTHON_INSTALL_MIRROR")
    provider, node = await open_node(providers, node_name)
    selected = parse_worker_selection(workers, node.shape.workers)
    flavour: JaxFlavour = jax or ("tpu" if provider.name == "gcp" else "cpu")
    targets = await provider.ssh_targets(node)
    linked = (
        console_site_packages()
        if (shares_console_machine(provider, targets) if link is None else link)
        else None
    )
    exact = linked is not None  # the linked packages were built for the console's own Python
    if exact and version != console_python_version():
        progress(f"{node.name}: Python {console_python_version()} (not {version}): the workers link this "
                 "machine's packages, which are built for it (--no-link installs instead)")
        version = console_python_version()
    requirements = trainer_requirements(flavour)
    spec = python or f"{'==' if exact else '>='}{version}"
    command, script = worker_recipes.bootstrap(
        python, version, requirements, environment_digest(requirements, spec, linked),
        exact=exact, link_site_packages=linked, link_tools=console_tools() if linked else (),
        force=force, install_mirror=mirror,
    )
    async with Fleet(targets) as fleet:
        await require_all_reachable(fleet, node_name, selected, "nothing was installed")
        how = "linking this machine's packages" if linked else f"jax for {flavour}"
        progress(f"{node.name}: bootstrapping {len(selected)} worker(s) with Python {spec} ({how})")
        setups = await run_on_workers(
            fleet, command, selected, stdin=script, timeout=BOOTSTRAP_TIMEOUT_S, on_worker=on_worker
        )
    lacking = [s for s in setups if not s.ok and (s.error or "").startswith(NO_PYTHON)]
    if lacking:
        named = ", ".join(str(s.worker) for s in lacking)
        raise UserError(f"worker(s) {named}: {lacking[0].error}")
    return SetupResult(node, setups)


def console_tools() -> list[str]:
    """Executables of the console's packages that a linked environment needs in its bin (py-spy)."""
    found = Path(sys.prefix) / "bin" / "py-spy"
    return [str(found)] if found.exists() else []
