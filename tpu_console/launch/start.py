"""Launching a job on every worker of a node, in one call (by hand: copy .env, nohup on each worker).

A job is the bundled trainer (the built-in job: `launch NODE --config F`) or any command
(`launch NODE -- CMD ...`, or a job file: launch/job_spec.py), which runs in the project `sync --dir/--git`
put on the workers, with the environment its setup made. Everything that can be checked on this machine
is checked before any worker is touched: the node exists and is READY, the config validates against the
trainer's schema (or the job file against its own), a named `.env` exists, the worker selection is in
range, every selected worker answers; then, in one round trip, that no run is alive there, that every
worker holds the same code and environment, and (the trainer) the model, the data and a writable
checkpoint folder the config names (launch/inputs.py). Then, in two phases so that a failure leaves no
half-started pod: (1) on every worker, make `~/tpu-console/runs/<run_id>/` and upload launch.json
(config.yaml for the trainer) and .env (0600); (2) start the detached job on every worker. If a start
fails, the workers that did start are stopped again.

Secrets: the `.env` content travels by SFTP into a 0600 file that the wrapper sources; it is never on a
command line, in launch.json, in the run database or in a message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import secrets
from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.history import bucket_record, ownership
from tpu_console.history.run_id import new_run_id
from tpu_console.history.store import RunRecord, RunStore, WorkerRecord
from tpu_console.launch import job_ports, multislice
from tpu_console.launch.job_kinds import (
    CommandKind,
    PreparedJob,
    TrainerKind,
    ValidatedConfig,
    validate_config,
)
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.lock import LaunchLock, lock_worker
from tpu_console.observe import supervision
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.pricing import price_per_hour
from tpu_console.providers.base import Provider, no_progress
from tpu_console.provision import worker_recipes as provision_recipes
from tpu_console.provision.code_sync import ENV_FILE as SYNCED_ENV_FILE
from tpu_console.provision.code_sync import code_version
from tpu_console.provision.steps import ignore_worker, run_on_workers
from tpu_console.provision.worker_inspection import default_python
from tpu_console.settings import load_settings
from tpu_console.worker import run_record
from tpu_console.worker.run_record import LaunchRecord

# The job as the wrapper starts it: the job runner (worker/job_runner.py), which runs the trainer and
# reports it to the run's supervisor.
RUNNER = "job_runner.py"  # shipped with the files it imports: fleet/run_recipes.py RUNNER_MODULES
# The names under which the console gives a job its coordinator (local and ssh pods only).
COORDINATOR_NAMES = ("TRAINER_COORDINATOR_ADDRESS", "TPU_CONSOLE_COORDINATOR_ADDRESS")


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
    job: dict[str, Any] | None = None  # launch.json's `job` object

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.starts)


def read_env_file(env_file: str | Path | None) -> bytes | None:
    """The `.env` content to upload, or None when none was named. The content is never shown."""
    return None if env_file is None else secrets.read_env_file(env_file)


def launch_env(
    provider: Provider, node: Node, fleet: Fleet, workers: list[int], command: bool = False,
    slices: Sequence[int] | None = None,
) -> dict[int, dict[str, str]]:
    """The non-secret environment of each worker's job: for the trainer, the process-count guard and the
    coordinator where JAX cannot find its peers by itself (local and ssh pods); for a command, that
    coordinator under the common names (`coordinator_env`). On some of a multislice's `slices`, every
    MEGASCALE variable is set for those slices alone (multislice.slices_env), on any provider."""
    targets = [fleet.targets[w] for w in workers]
    shared = provider.coordinator_env(node, targets)
    # Multislice: slice 0's first host coordinates megascale, at jax.distributed's coordinator address.
    coordinator_host = shared["TRAINER_COORDINATOR_ADDRESS"].rpartition(":")[0] if shared else ""
    port = multislice.megascale_port(node, coordinator_host) if shared and node.slices > 1 else 0
    if slices is not None:  # the first remaining host coordinates
        coordinator_host = coordinator_host or targets[0].host
        port = multislice.megascale_port(node, coordinator_host)
    envs: dict[int, dict[str, str]] = {}
    for position, worker in enumerate(workers):
        megascale = multislice.megascale_env(node, coordinator_host, worker, port) if shared else {}
        if slices is not None:
            megascale = multislice.slices_env(node, slices, coordinator_host, worker, port)
        elif node.slices > 1:  # where the runtime sets MEGASCALE_* itself, a program is still told its count
            megascale = {multislice.SLICE_COUNT: str(node.slices), **megascale}
        if command:
            envs[worker] = {**coordinator_env(shared, position), **megascale} if shared else {}
            continue
        env = {"TRAINER_REQUIRE_PROCESS_COUNT": str(len(workers)), **shared, **megascale}
        if shared:
            env["TRAINER_PROCESS_ID"] = str(position)
        envs[worker] = env
    return envs


def _selection(node: Node, workers: str, slices: Sequence[int] | None
               ) -> tuple[list[int], Node, tuple[int, ...] | None]:
    """The workers a launch runs on, the node as the run sees it, and the slices checked: every host of
    `slices` as a node of that many slices (multislice.on_slices), else the `--worker` selection."""
    if slices is None:
        return parse_worker_selection(workers, node.shape.workers), node, None
    chosen = multislice.check_slices(node, slices)
    return multislice.workers_of_slices(node, chosen), multislice.on_slices(node, chosen), chosen


def refuse_partial(node: Node, selected: list[int], envs: dict[int, dict[str, str]]) -> None:
    """A subset of workers only where the console names the coordinator: elsewhere JAX waits for them all."""
    multislice.refuse_partial_multislice(node, selected)
    if len(selected) < node.shape.workers and not has_coordinator(envs[selected[0]]):
        raise UserError(
            f"{node.name!r} is a {node.provider} pod where JAX joins every host by itself, so the job must "
            "run on all its workers; leave out --worker"
        )


def check_supervision(provider: Provider, node: Node, policy: SupervisionPolicy) -> Any:
    """UserError for a policy this node's provider cannot honour (the CLI and the launch form); the
    node's price estimate otherwise (None where the price table has none)."""
    estimate = price_per_hour(node)
    price = policy.price_per_hour if policy.price_per_hour is not None else estimate and estimate.per_hour
    can_delete = provider.supervisor_delete_target(node) is not None
    supervision.check_policy(policy, node.provider, can_delete, price)
    return estimate


def run_env(run_id: str, node: Node, worker: int, count: int) -> dict[str, str]:
    """What every job is told about its run (docs/contract.md); TPU_CONSOLE_RUN_DIR is set on the worker."""
    return {
        "TPU_CONSOLE_RUN_ID": run_id,
        "TPU_CONSOLE_NODE": node.name,
        "TPU_CONSOLE_WORKER": str(worker),
        "TPU_CONSOLE_WORKER_COUNT": str(count),
    }


def coordinator_env(shared: dict[str, str], position: int) -> dict[str, str]:
    """The coordinator for a command, under the names `jax.distributed.initialize` reads
    (JAX_COORDINATOR_ADDRESS: JAX 0.10 reads no name for the process count and id), ours, and the ones
    torch-style launchers set (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK)."""
    address, count = shared["TRAINER_COORDINATOR_ADDRESS"], shared["TRAINER_NUM_PROCESSES"]
    host, _, port = address.rpartition(":")
    return {
        "JAX_COORDINATOR_ADDRESS": address,
        "TPU_CONSOLE_COORDINATOR_ADDRESS": address,
        "TPU_CONSOLE_NUM_PROCESSES": count,
        "TPU_CONSOLE_PROCESS_ID": str(position),
        "MASTER_ADDR": host.strip("[]"),
        "MASTER_PORT": port,
        "WORLD_SIZE": count,
        "RANK": str(position),
    }


def has_coordinator(env: dict[str, str]) -> bool:
    """Whether the console names the coordinator for this pod's jobs (local and ssh pods)."""
    return any(name in env for name in COORDINATOR_NAMES)


async def launch(
    providers: dict[str, Provider],
    node_name: str,
    config_path: str | Path | None = None,
    overrides: Sequence[str] = (),
    env_file: str | Path | None = None,
    workers: str = "all",
    *,
    python: str | None = None,
    kill_stale: bool = False,
    fail_fast: bool = False,
    check_code: bool = True,
    check_ports: bool = True,
    store: RunStore | None = None,
    progress: Callable[[str], None] = no_progress,
    on_worker: Callable[[int, str], None] = ignore_worker,
    stop_grace_s: float = 5.0,
    before_send: Callable[[ValidatedConfig, Node], Awaitable[None]] | None = None,
    policy: SupervisionPolicy | None = None,
    webhook_url: str | None = None,
    job: JobSpec | None = None,
    slices: Sequence[int] | None = None,
) -> LaunchResult:
    """Start a job on the selected workers of `node_name` (all by default) and record the run: the bundled
    trainer with `config_path` (the built-in job), or the command `job` describes; exactly one of them.
    Both go through the one preflight below; what differs per kind is in `TrainerKind` / `CommandKind`.

    Refused before anything changes on a worker: a config the trainer would refuse on this node's shape,
    a run still alive on the node, workers without a trainer environment (unless `python` is given, or
    the pod shares this machine), and workers whose code or JAX versions differ (`check_code`); for a
    command, workers whose project, setup or Python differ; with `check_ports`, a worker that cannot reach
    the ports the job's hosts meet on (the JAX coordinator's, megascale's: launch/job_ports.py).
    `kill_stale` first kills processes holding the TPU and removes libtpu's lockfile on every worker.
    `fail_fast` is recorded in launch.json and enforced by the run's supervisor on the pod, which
    `policy` tells what else to do (restart, delete when done, budgets; for a command, the job's own
    `[supervisor]` when None); `webhook_url` is where it sends notifications (uploaded 0600 to the
    supervisor's worker only).
    `before_send` runs once the config and the node's shape are checked, before any worker is reached:
    a check of the caller's (the plan's fit, experiments/planning.py) that refuses by raising UserError.
    `slices` (a multislice node's slice indices, in order): run on every host of those slices only, as a
    run of that many slices (multislice.slices_env; the shape checks and `before_send` see that node), in
    place of `workers`; a command only when its job is `elastic`.
    """
    if (config_path is None) == (job is None):
        raise UserError("give one job: a trainer config (--config FILE), or a command (-- CMD ... or "
                        "--job FILE.toml), not both")
    kind: TrainerKind | CommandKind = (
        TrainerKind(validate_config(config_path, overrides), python, fail_fast, check_code, before_send)
        if job is None else CommandKind(job, python, check_code, providers, progress, on_worker))
    policy = kind.check_here(slices, policy)
    env_data = read_env_file(env_file)
    provider, node = await open_node(providers, node_name, slices)
    selected, seen, slices = _selection(node, workers, slices)
    estimate = check_supervision(provider, node, policy)
    await kind.check_node(seen, selected)
    targets = await provider.ssh_targets(node)
    store = store or RunStore()

    async with Fleet(targets) as fleet:
        envs = kind.job_env(launch_env(provider, node, fleet, selected, kind.command, slices=slices))
        refuse_partial(seen, selected, envs)
        await require_all_reachable(fleet, node, selected, "nothing was launched")
        # exclusive across consoles: of two launches at once on this node, one goes on (launch/lock.py)
        async with LaunchLock(fleet, node.name, selected[0], at=lock_worker(node)) as lock:
            prepared = await kind.prepare(provider, node, fleet, selected, env_data)
            if kill_stale:
                await clear_stale_holders(fleet, selected, on_worker)
            if check_ports:  # last: a stale job that --kill-stale stopped no longer holds them
                await job_ports.refuse_unreachable_ports(fleet, node, envs, selected)
            result = await _start_run(
                provider, node, fleet, targets, selected, envs, prepared, env_data, policy, estimate, store,
                progress, stop_grace_s, webhook_url, slice_count=seen.slices,
            )
            if result.ok:  # the run holds the node now; its end or a stop releases it
                await lock.keep(result.run_id)
    if env_file is not None:
        # so every later view of this node masks its values
        secrets.remember_env_file(node.name, env_file)
    return result


async def _start_run(
    provider: Provider,
    node: Node,
    fleet: Fleet,
    targets: list[Any],
    selected: list[int],
    envs: dict[int, dict[str, str]],
    prepared: PreparedJob,
    env_data: bytes | None,
    policy: SupervisionPolicy,
    estimate: Any,
    store: RunStore,
    progress: Callable[[str], None],
    stop_grace_s: float,
    webhook_url: str | None,
    slice_count: int | None = None,
) -> LaunchResult:
    """The two phases every job shares, once the checks passed: the run folders, then the supervisor and
    the job on every worker (the workers that started are stopped again when one did not); the record."""
    run_id = new_run_id()
    started = datetime.now(UTC)
    version = await asyncio.to_thread(code_version)
    job_record = prepared.record(run_id)
    for worker in selected:
        envs[worker] = {**run_env(run_id, node, worker, len(selected)), **envs[worker]}
    # the run's record, written once: each worker's launch.json, and the history's entry
    launch = LaunchRecord(
        run_id=run_id, node=node.name, provider=node.provider, accelerator_type=node.accelerator_type,
        workers=selected, slices=slice_count or node.slices,  # some of the node's slices, after a shrink
        started_at=started.isoformat(), python=prepared.python, command=prepared.argv,
        config_source=prepared.source, config_digest=prepared.digest, overrides=prepared.overrides,
        config=prepared.config, code_version=version, job=job_record, launched_by=ownership.me(),
        fail_fast=policy.fail_fast, supervised=True,
        # --price-per-hour where given (a node the price table does not know), else the table's
        price_per_hour=policy.price_per_hour if policy.price_per_hour is not None else (
            estimate.per_hour if estimate is not None else None),
    )
    record = RunRecord.from_launch(launch)
    bind, supervisor_host = provider.supervisor_address(node, targets)
    # the supervisor's orders; the run's own facts it reads from the record, uploaded before it starts
    plan = supervision.plan(
        policy=policy, delete_target=provider.supervisor_delete_target(node), bind=bind,
        coordinator_host=supervisor_host if has_coordinator(envs[selected[0]]) else None,
        record=bucket_record.supervisor_target(load_settings(), node.provider),
    )
    supervisor_python = default_python(provider)
    progress(f"{run_id}: preparing {len(selected)} worker(s) of {node.name}")
    problems = await _prepare(fleet, launch, prepared, env_data, envs, plan, webhook_url)
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
        starts = await _start(fleet, run_id, selected, envs, prepared, supervisor_python)
        if not all(s.ok for s in starts):
            await _undo(fleet, run_id, [s.worker for s in starts if s.ok], stop_grace_s)
            await fleet.run(run_recipes.stop_supervisor(run_id), [selected[0]], timeout=30)
    _record(store, record, starts)
    return LaunchResult(run_id, node, selected, starts, prepared.digest, run_recipes.run_dir(run_id),
                        job_record)


async def _prepare(
    fleet: Fleet,
    launch: LaunchRecord,
    prepared: PreparedJob,
    env_data: bytes | None,
    envs: dict[int, dict[str, str]],
    plan: dict[str, Any] | None = None,
    webhook_url: str | None = None,
) -> dict[int, str]:
    """Make the run folder and upload its files on every worker; the problems by worker (empty: all done)."""
    run_id, workers = launch.run_id, launch.workers
    # Without --env-file, the .env that `sync --env-file` left on the worker (if any) goes with the run.
    made = await fleet.run(
        run_recipes.prepare_run_dir(run_id, copy_env_from=None if env_data else SYNCED_ENV_FILE),
        workers,
        timeout=60,
    )
    problems = {r.worker: r.error or r.stderr.strip() or f"exit {r.exit_status}" for r in made if not r.ok}
    if problems:
        return problems
    folder = run_recipes.run_dir(run_id)
    synced_env = any("env=synced" in r.stdout for r in made)
    uploads = [fleet.put(content, f"{folder}/{name}", workers, mode=0o644)
               for name, content in prepared.files.items()]
    if env_data is not None:
        uploads.append(fleet.put(env_data, f"{folder}/.env", workers, mode=0o600))
    env_file = ".env" if env_data is not None else (SYNCED_ENV_FILE if synced_env else None)
    for worker in workers:  # envs: non-secret variables only; secrets are in .env
        own = launch.for_worker(worker, envs[worker], env_file)
        uploads.append(fleet.put(own.dumps(), f"{folder}/{run_record.FILE}", [worker]))
    if plan is not None:
        uploads.append(fleet.put(json.dumps(plan, indent=2).encode() + b"\n",
                                 f"{folder}/{supervision.PLAN_FILE}", workers, mode=0o600))
        first = workers[:1]  # the supervisor's worker
        for to, sources in ((workers, run_recipes.RUNNER_MODULE_SOURCES),
                            (first, run_recipes.SUPERVISOR_MODULE_SOURCES)):
            for name, source in sources.items():
                uploads.append(fleet.put(source, f"{folder}/{name}", to, mode=0o644))
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
    (result,) = await fleet.run(run_recipes.start_supervisor(run_id, python), [worker], timeout=60)
    port = next((line[5:] for line in result.stdout.splitlines() if line.startswith("port=")), "")
    if not result.ok or not port.isdigit():
        said = result.stderr.strip().splitlines()
        return {worker: "the run's supervisor did not start: "
                + (result.error or (said[-1] if said else f"exit {result.exit_status}"))}
    return f"{host}:{port}"


async def _start(
    fleet: Fleet, run_id: str, workers: list[int], envs: dict[int, dict[str, str]], prepared: PreparedJob,
    runner_python: str,
) -> list[WorkerStart]:
    job_args = (RUNNER, "--", *prepared.argv)  # the runner starts it in launch.json's job "cwd"

    async def start_one(worker: int) -> WorkerStart:
        command = run_recipes.start_detached(
            run_id, runner_python, job_args, envs[worker], home_env=prepared.home_env,
            home_prepend=prepared.home_prepend,
        )
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
        await fleet.run(run_recipes.stop_run(run_id, grace_s), started, timeout=grace_s + 30)


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


async def clear_stale_holders(
    fleet: Fleet, workers: list[int], on_worker: Callable[[int, str], None]
) -> None:
    """Kill leftover TPU holders and remove libtpu's lockfile on every worker (what `--kill-stale` asks)."""
    await run_on_workers(fleet, provision_recipes.kill_stale(), workers, timeout=60, on_worker=on_worker)
