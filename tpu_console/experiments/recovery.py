"""`tpu-console launch ... --recover`: a spot run that survives preemption, watched from this console.

It is the controller's loop (tpu_console/controller/loop.py, docs/managed-runs.md) run in the foreground
for one run: the run is launched, handed to the controller's store as a managed run, and this process
serves it until it ends: on a preemption, a TERMINATED or vanished node, or a host lost past
`lost_after_s`, it deletes what is left, creates the node again (its zone first, then the configured
zones), bootstraps, syncs, and launches the same config again; the trainer resumes from the latest
checkpoint in `checkpoint.dir`, which must outlive the node (a gs:// bucket on TPU VMs), as checked before
anything starts. Every recovery is recorded in the managed run (its incarnations, the steps lost, the
seconds from the loss to the first new step), which `tpu-console controller status` and `runs show` read.
Where a controller daemon holds the lease (`controller start`), it acts and this process follows.

The watch ends when a run ends on a node that is still READY (succeeded, failed or stopped: a failure
that is not a preemption is not retried), or when a budget runs out (max_recoveries).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tpu_console.controller import relaunch
from tpu_console.controller import state as st
from tpu_console.controller.handover import Budgets, hand_over
from tpu_console.controller.loop import Controller
from tpu_console.controller.state import ManagedRun
from tpu_console.controller.store import StateStore, open_store
from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet.preflight import open_node
from tpu_console.launch.job_kinds import ValidatedConfig, validate_config
from tpu_console.launch.start import LaunchResult, launch
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.providers.base import Provider, no_progress
from tpu_console.settings import load_settings


def require_durable_checkpoints(config_path: str, overrides: Sequence[str], provider: str) -> None:
    """Recovery resumes from checkpoints, so they must be on and stored where a new node can read them."""
    data = validate_config(config_path, overrides).data["checkpoint"]
    if not data.get("dir") or not data.get("every_steps"):
        raise UserError(
            "--recover needs checkpoints to resume from: set checkpoint.dir and checkpoint.every_steps"
        )
    if provider == "gcp" and not str(data["dir"]).startswith("gs://"):
        raise UserError(
            f"checkpoint.dir {data['dir']} is on the node's own disk, which a preemption takes with it; "
            "use a gs:// bucket with --recover"
        )
    if provider == "local" and not str(data["dir"]).startswith("/"):
        raise UserError(
            f"checkpoint.dir {data['dir']} is inside a worker's folder, which recreating the node "
            "wipes; use an absolute path outside it with --recover"
        )


async def launch_with_recovery(
    providers: dict[str, Provider],
    node_name: str,
    config_path: str,
    overrides: Sequence[str] = (),
    env_file: str | None = None,
    *,
    zones: Sequence[str] = (),
    max_recoveries: int = 3,
    watch_every_s: float = 30.0,
    python: str | None = None,
    bootstrap_options: dict[str, Any] | None = None,
    progress: Callable[[str], None] = no_progress,
    on_launch: Callable[[LaunchResult], None] = lambda _r: None,
    before_send: Callable[[ValidatedConfig, Node], Awaitable[None]] | None = None,
    notify: Callable[[str, str], None] = lambda _event, _text: None,
    policy: SupervisionPolicy | None = None,
    webhook_url: str | None = None,
    budgets: Budgets | None = None,
    store: StateStore | None = None,
) -> ManagedRun | None:
    """Launch, hand the run over, and serve it in the foreground until it ends; the managed run as it
    ended (None when the first launch did not start). `before_send` as for launch, before the first launch
    (a relaunch runs the same config on the same type). `policy` and `webhook_url` go to every launch's
    supervisor; a policy that deletes the node is refused, since recovery would only make it again."""
    if policy is not None and policy.deletes:
        raise UserError(
            "--recover recreates the node, and --on-end delete, --max-cost and --max-hang delete it: "
            "use one or the other"
        )
    provider, _node = await open_node(providers, node_name)
    require_durable_checkpoints(config_path, overrides, provider.name)
    policy = policy or SupervisionPolicy()
    result = await launch(
        providers, node_name, config_path, overrides, env_file, python=python, progress=progress,
        before_send=before_send, policy=policy, webhook_url=webhook_url,
    )
    on_launch(result)
    if not result.ok:
        return None
    store = store or open_store(load_settings())
    job = relaunch.job_of_trainer(validate_config(config_path, overrides), env_file, python, policy,
                                  bootstrap=bootstrap_options)
    budgets = budgets or Budgets(max_recoveries=max_recoveries)
    managed = hand_over(store, result, job, list(zones), budgets)
    progress(f"{result.run_id}: managed as {managed.id}; watching {node_name} every {watch_every_s:g} s")
    return await follow(providers, store, managed.id, watch_every_s, progress=progress, notify=notify,
                        webhook_url=webhook_url)


async def follow(providers: dict[str, Provider], store: StateStore, managed_id: str, poll_s: float, *,
                 progress: Callable[[str], None] = no_progress,
                 notify: Callable[[str, str], None] = lambda _event, _text: None,
                 webhook_url: str | None = None) -> ManagedRun:
    """Serve one managed run in the foreground until it ends (its sweep done); a controller daemon that
    holds the lease serves it instead, and this only reads its state."""
    controller = Controller(providers, store, poll_s=poll_s, read_timeout_s=max(30.0, poll_s),
                            where="launch --recover", webhook_url=webhook_url, notify=notify,
                            progress=progress, only={managed_id})

    def ended() -> bool:
        stored = st.load(store, managed_id)
        return stored is None or (stored.run.state.terminal and not stored.run.intent)

    await controller.serve(until=ended)
    stored = st.load(store, managed_id)
    assert stored is not None
    return stored.run
