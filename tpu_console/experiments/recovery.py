"""`tpu-console launch ... --recover`: a spot run that survives preemption.

By hand, a preempted spot VM means: notice (hours later), delete it (a PREEMPTED node still holds quota),
create it again (retrying zones), bootstrap, sync, relaunch, and hope the job resumes from its last
checkpoint. Here the console stays with the run and does exactly that, up to `max_recoveries` times:

1. launch the run as usual, then watch it (`watch_every_s`): the node's state from its provider and the
   run's state from its workers;
2. when the node is PREEMPTED / TERMINATED / gone, or every worker is lost while the node is not READY:
   delete it, create it again with the same name, type and spot setting (its zone first, then the
   configured zones), `bootstrap`, `sync`, and launch the same config again. The trainer resumes from the
   latest checkpoint in `checkpoint.dir` by itself; that folder must outlive the node (a gs:// bucket on
   TPU VMs), which the console checks before it starts;
3. each recovery is recorded: when, why, the last step seen before, the step the new run resumed from,
   and so the steps lost; kept in `$TPU_CONSOLE_HOME/recoveries/<first run id>.json`.

The watch ends when a run ends on a node that is still READY (succeeded, failed or stopped: a failure
that is not a preemption is not retried).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpu_console import locations
from tpu_console.errors import NotFound, UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node
from tpu_console.model import CreateRequest, Node, NodeState
from tpu_console.providers.base import Provider, no_progress
from tpu_console.providers.nodes import create_node, delete_node
from tpu_console.providers.registry import find_node
from tpu_console.provision.bootstrap import bootstrap_node
from tpu_console.provision.code_sync import sync_node
from tpu_console.runs import control as run_control
from tpu_console.runs.launch import LaunchResult, ValidatedConfig, launch, validate_config
from tpu_console.runs.supervision import SupervisionPolicy

_LOST_NODE_STATES = (NodeState.PREEMPTED, NodeState.TERMINATED)
_FINAL_RUN_STATES = ("succeeded", "failed", "stopped")
# looks at a node that reads READY while its run's workers are lost (or all killed), before the run's end
# is taken as final
_SUSPECT_CHECKS = 5



@dataclass
class Recovery:
    at: str
    reason: str
    old_run_id: str
    new_run_id: str | None = None
    last_step_before: int | None = None
    resumed_step: int | None = None  # the step the new run started after (0: no checkpoint was found)

    @property
    def steps_lost(self) -> int | None:
        if self.last_step_before is None or self.resumed_step is None:
            return None
        return max(0, self.last_step_before - self.resumed_step)


@dataclass
class RecoveryLog:
    node: str
    first_run_id: str
    runs: list[str] = field(default_factory=list)
    recoveries: list[Recovery] = field(default_factory=list)
    final_state: str | None = None
    gave_up: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for entry, recovery in zip(data["recoveries"], self.recoveries, strict=True):
            entry["steps_lost"] = recovery.steps_lost
        return data

    def save(self) -> None:
        folder = locations.home() / "recoveries"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.first_run_id}.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")


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


async def recreate_node(
    providers: dict[str, Provider], node: Node, zones: Sequence[str], progress: Callable[[str], None]
) -> Node:
    """Delete `node` (if still there) and create it again: same name, type and spot setting, its zone
    first."""
    try:
        await delete_node(providers, node.name, progress=progress)
    except NotFound:
        pass
    ordered = tuple(dict.fromkeys([z for z in (node.zone, *zones) if z and z != "local"]))
    request = CreateRequest(
        name=node.name,
        accelerator_type=node.accelerator_type,
        zones=ordered,
        spot=node.spot,
        runtime_version=node.runtime_version if node.provider == "gcp" else None,
    )
    return await create_node(providers, node.provider, request, progress=progress)


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
) -> RecoveryLog:
    """`before_send` as for launch, before the first launch (a relaunch runs the same config on the same
    type). `notify(event, text)` is told of each preemption (runs/notifications.py). `policy` and
    `webhook_url` go to every launch's supervisor, as for launch; a policy that deletes the node is
    refused, since recovery would only make it again."""
    if policy is not None and policy.deletes:
        raise UserError(
            "--recover recreates the node, and --on-end delete, --max-cost and --max-hang delete it: "
            "use one or the other"
        )
    provider, node = await open_node(providers, node_name)
    require_durable_checkpoints(config_path, overrides, provider.name)
    result = await launch(
        providers, node_name, config_path, overrides, env_file, python=python, progress=progress,
        before_send=before_send, policy=policy, webhook_url=webhook_url,
    )
    on_launch(result)
    log = RecoveryLog(node.name, result.run_id, runs=[result.run_id])
    if not result.ok:
        log.final_state = "failed"
        log.save()
        return log
    run_id, last_step, suspect_checks = result.run_id, None, 0
    while True:
        await asyncio.sleep(watch_every_s)
        reason = await _node_lost(providers, node_name)
        if reason is None:
            view = await run_control.run_status(providers, run_id)
            steps = [s.events.last_step.step for s in view.workers if s.events.last_step is not None]
            last_step = max(steps) if steps else last_step
            # Workers lost, or every job killed by a signal nobody here sent, while the node still reads
            # READY: the provider may not have noticed the preemption yet (on GCP the state follows the
            # VM's loss by a while, and a spot VM's shutdown signals its jobs first). Look again first.
            suspect = any(w.state == "lost" for w in view.workers) or _killed_unasked(view)
            if view.state not in _FINAL_RUN_STATES or (suspect and suspect_checks < _SUSPECT_CHECKS):
                suspect_checks = suspect_checks + 1 if suspect else 0
                continue
            # The node is asked again after the run's status: a preemption between the two reads ends the
            # jobs (killed, exit 137) on a node that read READY a moment before, and is no real end.
            reason = await _node_lost(providers, node_name)
            if reason is None:
                log.final_state = view.state
                break
        if len(log.recoveries) >= max_recoveries:
            log.gave_up = f"{reason}; {max_recoveries} recoveries already made"
            log.final_state = "failed"
            break
        progress(f"{node_name}: {reason}: recovering ({len(log.recoveries) + 1} of at most {max_recoveries})")
        notify("preempted", f"{node_name}: {reason} during run {run_id}: recreating it and relaunching")
        recovery = Recovery(
            datetime.now(UTC).isoformat(timespec="seconds"), reason, run_id, last_step_before=last_step
        )
        log.recoveries.append(recovery)
        node = await recreate_node(providers, node, zones, progress)
        await bootstrap_node(providers, node_name, progress=progress, **(bootstrap_options or {}))
        await sync_node(providers, node_name, progress=progress)
        result = await launch(
            providers, node_name, config_path, overrides, env_file, python=python, progress=progress,
            policy=policy, webhook_url=webhook_url,
        )
        on_launch(result)
        recovery.new_run_id, run_id, last_step, suspect_checks = result.run_id, result.run_id, None, 0
        log.runs.append(run_id)
        recovery.resumed_step = await _resumed_step(providers, node_name, run_id)
        log.save()
        progress(f"{node_name}: relaunched as {run_id}, resuming after step {recovery.resumed_step}")
    log.save()
    return log


def _killed_unasked(view: run_control.RunView) -> bool:
    """Every worker's job ended by SIGKILL or SIGTERM (exit 137 or 143) and no stop was asked for: how a
    preemption's end looks from the jobs (a fail-fast stop leaves the failing worker's own status)."""
    statuses = [w.exit_status for w in view.workers]
    return (bool(statuses) and all(s in (137, 143) for s in statuses)
            and view.record.stop_requested_at is None)


async def _node_lost(providers: dict[str, Provider], node_name: str) -> str | None:
    """Why the node can no longer run the job, or None while it is fine."""
    try:
        _, node = await find_node(providers, node_name)
    except NotFound:
        return "the node is gone"
    if node.state in _LOST_NODE_STATES:
        return f"the node is {node.state.value}"
    return None


async def _resumed_step(
    providers: dict[str, Provider], node_name: str, run_id: str, timeout_s: float = 600
) -> int:
    """The step the relaunched run resumed after: the trainer's `resumed_step` warning, or 0 once it has
    reported a first step without one (no checkpoint was found)."""
    provider, node = await find_node(providers, node_name)
    path = f"tpu-console/runs/{run_id}/events.jsonl"
    async with Fleet(await provider.ssh_targets(node)) as fleet:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            (result,) = await fleet.run(f"cat {path} 2>/dev/null; true", [0], timeout=30)
            for line in result.stdout.splitlines():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("resumed_step") is not None:
                    return int(event["resumed_step"])
                if event.get("kind") in ("step", "error", "end"):
                    return 0
            await asyncio.sleep(1.0)
    return 0
