"""Launching the trainer on every worker of a node, in one call (by hand: copy .env, nohup on each worker).

Everything that can be checked on this machine is checked before any worker is touched: the node exists
and is READY, the config validates against the trainer's schema, a named `.env` exists, the worker
selection is in range, every selected worker answers; then, in one round trip, that every worker is ready
and has the model, the data and a writable checkpoint folder the config names (runs/inputs.py). Then, in
two phases so that a failure leaves no half-started pod: (1) on every worker, make
`~/tpu-console/runs/<run_id>/` and upload launch.json, config.yaml and .env (0600); (2) start the detached
job on every worker. If a start fails, the workers that did start are stopped again.

Secrets: the `.env` content travels by SFTP into a 0600 file that the wrapper sources; it is never on a
command line, in launch.json, in the run database or in a message.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import secrets
from tpu_console.errors import UserError
from tpu_console.fleet import recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.model import Node
from tpu_console.pricing import price_per_hour
from tpu_console.providers.base import Provider, no_progress
from tpu_console.provision import recipes as provision_recipes
from tpu_console.provision.code_sync import ENV_FILE as SYNCED_ENV_FILE
from tpu_console.provision.code_sync import code_version
from tpu_console.provision.recipes import ENV_PYTHON
from tpu_console.provision.report import WorkerReport, mismatches
from tpu_console.provision.steps import ignore_worker, run_on_workers
from tpu_console.runs import supervision
from tpu_console.runs.inputs import job_inputs, refuse_missing
from tpu_console.runs.run_id import new_run_id
from tpu_console.runs.store import RunRecord, RunStore, WorkerRecord
from tpu_console.runs.supervision import SupervisionPolicy
from tpu_console.secrets import parse_env

TRAINER_ARGS = ("-m", "trainer", "--config", "config.yaml", "--run-dir", ".")
# The job as the wrapper starts it: the job runner (worker/job_runner.py), which runs the trainer and
# reports it to the run's supervisor.
RUNNER, SUPERVISOR = "job_runner.py", "supervisor.py"
STEP_LINES = "step_lines.py"  # imported by the runner: a command job's step lines into events.jsonl



@dataclass(frozen=True)
class ValidatedConfig:
    path: Path
    overrides: list[str]
    yaml_text: str  # config.yaml as the trainer reads it: every key, defaults included
    data: dict[str, Any]
    digest: str  # the trainer's own digest, the same its `start` event reports
    config: Any  # the trainer's TrainerConfig, for the checks against the node's shape


@dataclass(frozen=True)
class WorkerStart:
    worker: int
    pgid: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.pgid is not None


@dataclass
class LaunchResult:
    run_id: str
    node: Node
    workers: list[int]
    starts: list[WorkerStart]
    config_digest: str
    run_dir: str  # relative to each worker's home

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.starts)


def validate_config(config_path: str | Path, overrides: Sequence[str] = ()) -> ValidatedConfig:
    """The config with `--set` overrides applied, validated by the trainer's schema. Importing
    trainer.config needs only pydantic and PyYAML (no JAX), so this runs on a laptop."""
    from trainer.config import ConfigError, dump_yaml, load_config

    path = Path(config_path).expanduser()
    if not path.is_file():
        raise UserError(f"config file {path} does not exist; pass --config with an existing YAML file")
    try:
        cfg = load_config(path, list(overrides))
    except ConfigError as exc:
        raise UserError(f"{path}: {exc}") from None
    return ValidatedConfig(
        path=path,
        overrides=list(overrides),
        yaml_text=dump_yaml(cfg),
        data=cfg.model_dump(mode="json"),
        digest=cfg.digest(),
        config=cfg,
    )


def check_shape(config: ValidatedConfig, node: Node, process_count: int) -> None:
    """The checks the trainer makes after jax.distributed starts (prompts per process, local batch
    divisible by the local devices, the mesh fits), made here from the node's shape, so a batch that
    does not divide costs no TPU time."""
    from trainer.config import ConfigError, check_pod_shape

    try:
        check_pod_shape(config.config, process_count, node.shape.devices_per_worker)
    except ConfigError as exc:
        shape = f"{process_count} worker(s) x {node.shape.devices_per_worker} devices"
        raise UserError(f"{config.path.name} on {node.name} ({shape}): {exc}") from None


def read_env_file(env_file: str | Path | None) -> bytes | None:
    """The `.env` content to upload, or None when none was named. The content is never shown."""
    return None if env_file is None else secrets.read_env_file(env_file)


def default_python(provider: Provider) -> str:
    """Local workers share this machine, so they run this very interpreter; elsewhere `python3`."""
    return sys.executable if provider.name == "local" else "python3"


def worker_python(provider: Provider, reports: list[WorkerReport]) -> str:
    """The interpreter for jobs on these workers: the environment `bootstrap` made when every worker has
    one, else this console's own on local pods (`python3` elsewhere, which `launch` then refuses)."""
    return ENV_PYTHON if all(r.env_present for r in reports) else default_python(provider)


def launch_env(provider: Provider, node: Node, fleet: Fleet, workers: list[int]) -> dict[int, dict[str, str]]:
    """The non-secret environment of each worker's job: the process-count guard, and the coordinator
    where JAX cannot find its peers by itself (local and ssh pods)."""
    targets = [fleet.targets[w] for w in workers]
    shared = provider.coordinator_env(node, targets)
    envs: dict[int, dict[str, str]] = {}
    for position, worker in enumerate(workers):
        env = {"TRAINER_REQUIRE_PROCESS_COUNT": str(len(workers)), **shared}
        if shared:
            env["TRAINER_PROCESS_ID"] = str(position)
        envs[worker] = env
    return envs


def check_supervision(provider: Provider, node: Node, policy: SupervisionPolicy) -> Any:
    """UserError for a policy this node's provider cannot honour (the CLI and the launch form); the
    node's price estimate otherwise (None where the price table has none)."""
    estimate = price_per_hour(node)
    price = policy.price_per_hour if policy.price_per_hour is not None else estimate and estimate.per_hour
    can_delete = provider.supervisor_delete_target(node) is not None
    supervision.check_policy(policy, node.provider, can_delete, price)
    return estimate


async def launch(
    providers: dict[str, Provider],
    node_name: str,
    config_path: str | Path,
    overrides: Sequence[str] = (),
    env_file: str | Path | None = None,
    workers: str = "all",
    *,
    python: str | None = None,
    kill_stale: bool = False,
    fail_fast: bool = False,
    check_code: bool = True,
    store: RunStore | None = None,
    progress: Callable[[str], None] = no_progress,
    on_worker: Callable[[int, str], None] = ignore_worker,
    stop_grace_s: float = 5.0,
    before_send: Callable[[ValidatedConfig, Node], Awaitable[None]] | None = None,
    policy: SupervisionPolicy | None = None,
    webhook_url: str | None = None,
) -> LaunchResult:
    """Start the trainer on the selected workers of `node_name` (all by default) and record the run.

    Refused before anything changes on a worker: a config the trainer would refuse on this node's shape,
    a run still alive on the node, workers without a trainer environment (unless `python` is given, or
    the pod shares this machine), and workers whose code or JAX versions differ (`check_code`).
    `kill_stale` first kills processes holding the TPU and removes libtpu's lockfile on every worker.
    `fail_fast` is recorded in launch.json and enforced by the run's supervisor on the pod, which
    `policy` tells what else to do (restart, delete when done, budgets); `webhook_url` is where it sends
    notifications (uploaded 0600 to the supervisor's worker only).
    `before_send` runs once the config and the node's shape are checked, before any worker is reached:
    a check of the caller's (the plan's fit, experiments/plan.py) that refuses by raising UserError.
    """
    config = validate_config(config_path, overrides)
    needed = job_inputs(config.config)  # a malformed hub id or gs:// path is refused here
    env_data = read_env_file(env_file)
    if python is not None and not python.strip():
        raise UserError("--python is empty; give an interpreter, e.g. --python python3")
    provider, node = await open_node(providers, node_name)
    selected = parse_worker_selection(workers, node.shape.workers)
    check_shape(config, node, len(selected))
    policy = policy or SupervisionPolicy(fail_fast=fail_fast)
    estimate = check_supervision(provider, node, policy)
    if before_send is not None:
        await before_send(config, node)
    targets = await provider.ssh_targets(node)
    store = store or RunStore()

    async with Fleet(targets) as fleet:
        envs = launch_env(provider, node, fleet, selected)
        if len(selected) < node.shape.workers and "TRAINER_COORDINATOR_ADDRESS" not in envs[selected[0]]:
            raise UserError(
                f"{node_name!r} is a {node.provider} pod where JAX joins every host by itself, so the job "
                "must "
                "run on all its workers; leave out --worker"
            )
        await require_all_reachable(fleet, node_name, selected, "nothing was launched")
        # the same round trip asks whether the model, the data and the checkpoint folder are there
        reports = await inspect_workers(fleet, selected, also=recipes.check_inputs(
            [(i.key, i.path, i.need) for i in needed]))
        refuse_unready(node, reports, config, env_data, python, check_code)
        refuse_missing(node, needed, {r.worker: r.inputs for r in reports})
        interpreter = python or worker_python(provider, reports)
        if kill_stale:
            await clear_stale_holders(fleet, selected, on_worker)

        run_id = new_run_id()
        started = datetime.now(UTC)
        version = await asyncio.to_thread(code_version)
        record = RunRecord(
            run_id=run_id,
            node=node.name,
            provider=node.provider,
            accelerator_type=node.accelerator_type,
            workers=selected,
            config_path=str(config.path),
            config_digest=config.digest,
            overrides=config.overrides,
            python=interpreter,
            started_at=started,
            code_version=version["git_sha"] + ("+dirty" if version["dirty"] else "") if version else None,
            price_per_hour=estimate.per_hour if estimate is not None else None,
        )
        bind, supervisor_host = provider.supervisor_address(node, targets)
        plan = supervision.plan(
            run_id=run_id, node=node.name, provider=node.provider, workers=selected,
            started_at=started.timestamp(), policy=policy,
            price_per_hour=estimate.per_hour if estimate is not None else None,
            delete_target=provider.supervisor_delete_target(node), bind=bind,
            coordinator_host=supervisor_host if "TRAINER_COORDINATOR_ADDRESS" in envs[selected[0]] else None,
        )
        supervisor_python = default_python(provider)
        progress(f"{run_id}: preparing {len(selected)} worker(s) of {node.name}")
        problems = await _prepare(
            fleet, run_id, selected, config, env_data, node, envs, interpreter, version, started,
            policy.fail_fast, plan, webhook_url,
        )
        if not problems:
            progress(f"{run_id}: starting the run's supervisor on worker {selected[0]}")
            address = await _start_supervisor(fleet, run_id, selected[0], supervisor_python, supervisor_host)
            if isinstance(address, str):
                for worker_env in envs.values():
                    worker_env[supervision.ADDRESS_ENV] = address
            else:
                problems = address
        if problems:
            starts = [
                WorkerStart(w, error=problems.get(w, "not started: another worker failed")) for w in selected
            ]
        else:
            progress(f"{run_id}: starting the job on {len(selected)} worker(s)")
            starts = await _start(fleet, run_id, selected, envs, interpreter, supervisor_python)
            if not all(s.ok for s in starts):
                await _undo(fleet, run_id, [s.worker for s in starts if s.ok], stop_grace_s)
                await fleet.run(recipes.stop_supervisor(run_id), [selected[0]], timeout=30)
        _record(store, record, starts)
        if env_file is not None:
            # so every later view of this node masks its values
            secrets.remember_env_file(node.name, env_file)
    return LaunchResult(run_id, node, selected, starts, config.digest, recipes.run_dir(run_id))


async def _prepare(
    fleet: Fleet,
    run_id: str,
    workers: list[int],
    config: ValidatedConfig,
    env_data: bytes | None,
    node: Node,
    envs: dict[int, dict[str, str]],
    python: str,
    version: dict[str, Any] | None,
    started: datetime,
    fail_fast: bool = False,
    plan: dict[str, Any] | None = None,
    webhook_url: str | None = None,
) -> dict[int, str]:
    """Make the run folder and upload its files on every worker; the problems by worker (empty: all done)."""
    # Without --env-file, the .env that `sync --env-file` left on the worker (if any) goes with the run.
    made = await fleet.run(
        recipes.prepare_run_dir(run_id, copy_env_from=None if env_data else SYNCED_ENV_FILE),
        workers,
        timeout=60,
    )
    problems = {r.worker: r.error or r.stderr.strip() or f"exit {r.exit_status}" for r in made if not r.ok}
    if problems:
        return problems
    folder = recipes.run_dir(run_id)
    synced_env = any("env=synced" in r.stdout for r in made)
    uploads = [fleet.put(config.yaml_text.encode(), f"{folder}/config.yaml", workers, mode=0o644)]
    if env_data is not None:
        uploads.append(fleet.put(env_data, f"{folder}/.env", workers, mode=0o600))
    for worker in workers:
        manifest = {
            "run_id": run_id,
            "node": node.name,
            "provider": node.provider,
            "accelerator_type": node.accelerator_type,
            "worker": worker,
            "workers": workers,
            "started_at": started.isoformat(),
            "code_version": version,
            "python": python,
            "command": [python, "-u", *TRAINER_ARGS],
            "env": envs[worker],  # non-secret variables only; secrets are in .env
            "env_file": ".env" if env_data is not None else (SYNCED_ENV_FILE if synced_env else None),
            "fail_fast": fail_fast,
            "supervised": plan is not None,
            "config_source": str(config.path),
            "overrides": config.overrides,
            "config_digest": config.digest,
            "config": config.data,
        }
        uploads.append(
            fleet.put(json.dumps(manifest, indent=2).encode() + b"\n", f"{folder}/launch.json", [worker])
        )
    if plan is not None:
        uploads.append(fleet.put(json.dumps(plan, indent=2).encode() + b"\n",
                                 f"{folder}/{supervision.PLAN_FILE}", workers, mode=0o600))
        uploads.append(fleet.put(recipes.RUNNER_SOURCE, f"{folder}/{RUNNER}", workers, mode=0o644))
        uploads.append(fleet.put(recipes.STEP_LINES_SOURCE, f"{folder}/{STEP_LINES}", workers, mode=0o644))
        first = workers[:1]  # the supervisor's worker
        uploads.append(fleet.put(recipes.SUPERVISOR_SOURCE, f"{folder}/{SUPERVISOR}", first, mode=0o644))
        if webhook_url:
            notify = supervision.notify_file(webhook_url)
            uploads.append(fleet.put(notify, f"{folder}/{supervision.NOTIFY_FILE}", first, mode=0o600))
    for results in await asyncio.gather(*uploads):
        for r in results:
            if not r.ok:
                problems.setdefault(r.worker, r.error or "upload failed")
    return problems


async def _start_supervisor(
    fleet: Fleet, run_id: str, worker: int, python: str, host: str
) -> str | dict[int, str]:
    """Start the run's supervisor on `worker`: the address the jobs report to, or the problem."""
    (result,) = await fleet.run(recipes.start_supervisor(run_id, python), [worker], timeout=60)
    port = next((line[5:] for line in result.stdout.splitlines() if line.startswith("port=")), "")
    if not result.ok or not port.isdigit():
        said = result.stderr.strip().splitlines()
        return {worker: "the run's supervisor did not start: "
                + (result.error or (said[-1] if said else f"exit {result.exit_status}"))}
    return f"{host}:{port}"


async def _start(
    fleet: Fleet, run_id: str, workers: list[int], envs: dict[int, dict[str, str]], python: str,
    runner_python: str,
) -> list[WorkerStart]:
    job_args = (RUNNER, "--", python, "-u", *TRAINER_ARGS)

    async def start_one(worker: int) -> WorkerStart:
        command = recipes.start_detached(run_id, runner_python, job_args, envs[worker])
        (result,) = await fleet.run(command, [worker], timeout=60)
        if not result.ok:
            said = result.stderr.strip().splitlines()
            return WorkerStart(
                worker, error=result.error or (said[-1] if said else f"exit {result.exit_status}")
            )
        pgid = next((line[5:] for line in result.stdout.splitlines() if line.startswith("pgid=")), "")
        if not pgid.isdigit():
            return WorkerStart(
                worker, error=f"unexpected answer from the launch wrapper: {result.stdout.strip()!r}"
            )
        return WorkerStart(worker, pgid=int(pgid))

    return list(await asyncio.gather(*(start_one(w) for w in workers)))


async def _undo(fleet: Fleet, run_id: str, started: list[int], grace_s: float) -> None:
    """Stop the workers that did start when others did not: a partial pod would only wait and time out."""
    if started:
        await fleet.run(recipes.stop_run(run_id, grace_s), started, timeout=grace_s + 30)


def _record(store: RunStore, record: RunRecord, starts: list[WorkerStart]) -> None:
    ok = all(s.ok for s in starts)
    record.worker_records = {
        s.worker: WorkerRecord(s.worker, "pending" if ok else "failed", s.pgid, s.error) for s in starts
    }
    if not ok:
        first = next(s for s in starts if not s.ok)
        record.state, record.failure = "failed", f"worker {first.worker} did not start: {first.error}"
        record.finished_at = datetime.now(UTC)
    store.add(record)


async def inspect_workers(fleet: Fleet, workers: list[int], also: str = "") -> list[WorkerReport]:
    """Environment, code, versions and live runs of each worker, and what `also` asks, in one round trip."""
    command = provision_recipes.inspect_worker() + (f"\n{also}" if also else "")
    results = await fleet.run(command, workers, timeout=60)
    reports = []
    for result in results:
        if not result.ok:
            raise UserError(
                f"worker {result.worker} could not be inspected "
                f"({result.error or result.stderr.strip() or result.exit_status}); nothing was launched"
            )
        reports.append(WorkerReport.parse(result.worker, result.stdout))
    return reports


def refuse_unready(
    node: Node,
    reports: list[WorkerReport],
    config: ValidatedConfig,
    env_data: bytes | None,
    python: str | None,
    check_code: bool,
) -> None:
    """UserError when the workers are not ready for this launch; see `launch` for what is checked."""
    live = {run_id: r.worker for r in reports for run_id in r.live_runs}
    if live:
        run_id, worker = next(iter(live.items()))
        raise UserError(
            f"run {run_id} is still running on {node.name} (worker {worker}); stop it first with "
            f"`tpu-console stop {node.name} {run_id}`"
        )
    missing = [r.worker for r in reports if not r.env_present]
    if python is None and missing and node.provider != "local":
        raise UserError(
            f"worker {missing[0]} of {node.name} has no trainer environment; run "
            f"`tpu-console bootstrap {node.name}` then `tpu-console sync {node.name}`"
        )
    if python is None and check_code:
        if any(r.env_present and not r.code for r in reports) and node.provider != "local":
            worker = next(r.worker for r in reports if r.env_present and not r.code)
            raise UserError(
                f"worker {worker} of {node.name} has no code installed; run `tpu-console sync {node.name}`"
            )
        if differences := mismatches(reports):
            raise UserError(
                f"the workers of {node.name} do not run the same software: {'; '.join(differences)}; "
                f"run `tpu-console bootstrap {node.name}` and `tpu-console sync {node.name}`"
            )
    if config.data.get("wandb_mode") == "online":
        keys = parse_env(env_data.decode("utf-8", "replace")) if env_data else {}
        synced = all(r.env_file_present for r in reports)
        if not keys.get("WANDB_API_KEY") and not (env_data is None and synced):
            raise UserError(
                "wandb_mode is online but no .env gives WANDB_API_KEY; pass --env-file .env (or "
                f"`tpu-console sync {node.name} --env-file .env`), or --set wandb_mode=offline"
            )


async def clear_stale_holders(
    fleet: Fleet, workers: list[int], on_worker: Callable[[int, str], None]
) -> None:
    """Kill leftover TPU holders and remove libtpu's lockfile on every worker (what `--kill-stale` asks)."""
    await run_on_workers(fleet, provision_recipes.kill_stale(), workers, timeout=60, on_worker=on_worker)
