"""`tpu-console bootstrap NODE`: give every worker the trainer's Python environment, in parallel.

What one does by hand on each worker (install Python, make an environment, pip install JAX and the
rest), done once per node and idempotently: a worker whose environment already holds exactly what this
bootstrap would install answers "already in place" in about a second. Each worker reports the versions it
ended with (python, jax, jaxlib, libtpu, flax), read without importing JAX. See docs/workers.md.
"""

from __future__ import annotations

from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.providers.base import Progress, Provider, no_progress
from tpu_console.provision import recipes
from tpu_console.provision.requirements import JaxFlavour, environment_digest, trainer_requirements
from tpu_console.provision.steps import (
    OnWorker,
    SetupResult,
    console_site_packages,
    ignore_worker,
    run_on_workers,
    shares_console_machine,
)

BOOTSTRAP_TIMEOUT_S = 1800.0  # a first jax[tpu] install downloads about a gigabyte



async def bootstrap_node(
    providers: dict[str, Provider],
    node_name: str,
    *,
    workers: str = "all",
    python: str = "python3",
    jax: JaxFlavour | None = None,
    link: bool | None = None,
    force: bool = False,
    progress: Progress = no_progress,
    on_worker: OnWorker = ignore_worker,
) -> SetupResult:
    """Make `~/tpu-console/env` on the selected workers hold the trainer's dependencies.

    `jax`: "tpu" (jax[tpu], with libtpu) or "cpu"; by default tpu on gcp nodes, cpu elsewhere.
    `link`: see the console's own packages instead of installing (default: when the pod shares the
    console's machine, as local pods do).
    """
    if not python.strip():
        raise UserError("--python is empty; give the workers' base interpreter, e.g. --python python3")
    provider, node = await open_node(providers, node_name)
    selected = parse_worker_selection(workers, node.shape.workers)
    flavour: JaxFlavour = jax or ("tpu" if provider.name == "gcp" else "cpu")
    targets = await provider.ssh_targets(node)
    linked = (
        console_site_packages()
        if (shares_console_machine(provider, targets) if link is None else link)
        else None
    )
    requirements = trainer_requirements(flavour)
    command, script = recipes.bootstrap(
        python, requirements, environment_digest(requirements, python, linked), linked, force
    )
    async with Fleet(targets) as fleet:
        await require_all_reachable(fleet, node_name, selected, "nothing was installed")
        how = "linking this machine's packages" if linked else f"jax for {flavour}"
        progress(f"{node.name}: bootstrapping {len(selected)} worker(s) ({how})")
        setups = await run_on_workers(
            fleet, command, selected, stdin=script, timeout=BOOTSTRAP_TIMEOUT_S, on_worker=on_worker
        )
    return SetupResult(node, setups)
