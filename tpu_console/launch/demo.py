"""`tpu-console demo NODE`, and the launch form's offer for the tiny configs: the offline demo's inputs
(a tiny random Qwen2 and synthetic GSM8K-format data, at the config's `model_path` and `data.path`), made
by the trainer on every worker that lacks them, so a local pod goes from `sync` to a run with nothing typed
by hand. What is there already is left alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.launch.inputs import job_inputs
from tpu_console.launch.job_kinds import validate_config
from tpu_console.providers.base import Provider, no_progress
from tpu_console.provision.steps import WorkerSetup, ignore_worker, run_on_workers
from tpu_console.provision.worker_inspection import inspect_workers, worker_python

TINY_CONFIGS = ("tiny_local.yaml", "tiny_toy_reward.yaml")  # the shipped configs of the offline demo


def tiny_config() -> Path:
    import trainer

    return Path(trainer.__file__).parent / "configs" / TINY_CONFIGS[0]


def is_tiny_config(config_path: str | Path) -> bool:
    """A shipped config of the offline demo: its inputs are the ones `make_tiny_inputs` makes."""
    path = Path(config_path).expanduser()
    return path.name in TINY_CONFIGS and path.resolve().parent == tiny_config().resolve().parent


@dataclass
class DemoResult:
    node: Node
    model_path: str
    data_path: str
    workers: list[WorkerSetup]

    @property
    def ok(self) -> bool:
        return all(w.ok for w in self.workers)


async def make_tiny_inputs(
    providers: dict[str, Provider],
    node_name: str,
    config_path: str | Path | None = None,
    overrides: Sequence[str] = (),
    *,
    python: str | None = None,
    progress: Callable[[str], None] = no_progress,
    on_worker: Callable[[int, str], None] = ignore_worker,
) -> DemoResult:
    """The tiny model and synthetic data at the config's `model_path` and `data.path` (tiny_local.yaml's by
    default) on every worker of the node that lacks them; what is there already is left alone."""
    config = validate_config(config_path or tiny_config(), overrides).config
    paths = {i.key: i.path for i in job_inputs(config)}
    if "model_path" not in paths or "data.path" not in paths:
        raise UserError(
            "the demo makes a local model_path and data.path, and this config names a hub id or gs:// path; "
            "use trainer/configs/tiny_local.yaml"
        )
    provider, node = await open_node(providers, node_name)
    targets = await provider.ssh_targets(node)
    workers = list(range(node.shape.workers))
    async with Fleet(targets) as fleet:
        await require_all_reachable(fleet, node_name, workers, "nothing was made")
        interpreter = python or worker_python(provider, await inspect_workers(fleet, workers))
        progress(f"{node.name}: the tiny model and data on {len(workers)} worker(s) where missing")
        command = run_recipes.make_tiny_inputs(interpreter, paths["model_path"], paths["data.path"])
        setups = await run_on_workers(fleet, command, workers, timeout=600, on_worker=on_worker)
    return DemoResult(node, paths["model_path"], paths["data.path"], setups)
