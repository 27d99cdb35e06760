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
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import secrets
from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet import recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.history import bucket_record, ownership
from tpu_console.history.run_id import new_run_id
from tpu_console.history.store import RunRecord, RunStore, WorkerRecord
from tpu_console.launch import job_ports, multislice
from tpu_console.launch.inputs import job_inputs, refuse_missing
from tpu_console.launch.job_spec import JobSpec, MetricsSpec
from tpu_console.launch.lock import LaunchLock
from tpu_console.observe import supervision
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.pricing import price_per_hour
from tpu_console.providers.base import Provider, no_progress
from tpu_console.provision import recipes as provision_recipes
from tpu_console.provision.code_sync import ENV_FILE as SYNCED_ENV_FILE
from tpu_console.provision.code_sync import code_version
from tpu_console.provision.project_setup import stale_requirements, stale_setup
from tpu_console.provision.project_sync import changed_since_sync, project_path_in
from tpu_console.provision.recipes import ENV_DIR, ENV_PYTHON
from tpu_console.provision.report import WorkerReport, mismatches
from tpu_console.provision.steps import ignore_worker, run_on_workers
from tpu_console.provision.worker_inspection import default_python, inspect_workers, worker_python
from tpu_console.secrets import parse_env
from tpu_console.settings import load_settings
from tpu_console.worker import run_record
from tpu_console.worker.run_record import LaunchRecord

TRAINER_ARGS = ("-m", "trainer", "--config", "config.yaml", "--run-dir", ".")
# The job as the wrapper starts it: the job runner (worker/job_runner.py), which runs the trainer and
# reports it to the run's supervisor.
RUNNER, SUPERVISOR = "job_runner.py", "supervisor.py"
STEP_LINES = "step_lines.py"  # imported by the runner: a command job's step lines into events.jsonl
LOG_TIMESTAMPS = "log_timestamps.py"  # imported by the runner: the time a step line gives itself
PREEMPTION_NOTICE = "preemption_notice.py"  # imported by the runner: the VM's notice, passed to the job
RUN_RECORD = "run_record.py"  # imported by the runner and the supervisor: launch.json's one schema
# The names under which the console gives a job its coordinator (local and ssh pods only).
COORDINATOR_NAMES = ("TRAINER_COORDINATOR_ADDRESS", "TPU_CONSOLE_COORDINATOR_ADDRESS")


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
    job: dict[str, Any] | None = None  # launch.json's `job` object

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


def check_shape(config: ValidatedConfig, node: Node, process_count: int) -> None:  # node: as the run sees it
    """The checks the trainer makes after jax.distributed starts (prompts per process, local batch
    divisible by the local devices, the mesh fits), made here from the node's shape, so a batch that
    does not divide costs no TPU time."""
    from trainer.config import ConfigError, check_pod_shape

    try:
        check_pod_shape(config.config, process_count, node.shape.devices_per_worker, node.slices)
    except ConfigError as exc:
        slices = f"{node.slices} slices, " if node.slices > 1 else ""
        shape = f"{slices}{process_count} worker(s) x {node.shape.devices_per_worker} devices"
        raise UserError(f"{config.path.name} on {node.name} ({shape}): {exc}") from None


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


@dataclass(frozen=True)
class PreparedJob:
    """A job as every worker runs it, resolved against what the workers hold (their project and setup):
    what launch.json and the run record keep, and what the start command needs."""

    kind: str  # trainer | command
    argv: list[str]
    source: str  # the record's config_path: the trainer config, the job file, or the command line
    digest: str
    python: str  # the interpreter the job runs with, as far as the console knows it
    metrics: dict[str, Any]
    overrides: list[str] = field(default_factory=list)
    cwd: str | None = None  # relative to the worker's home; None: the run folder
    env_dir: str | None = None  # the environment whose bin/ leads PATH (relative to the home)
    project: dict[str, Any] | None = None  # project.json of the workers
    setup: dict[str, Any] | None = None  # setup.json of the workers
    job_file: str | None = None
    job_file_text: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)  # run-folder files besides launch.json
    config: dict[str, Any] | None = None  # the trainer's config as sent (launch.json's `config`)

    def record(self, run_id: str) -> dict[str, Any]:
        """launch.json's `job` object, also kept in the run record (docs/contract.md)."""
        return {
            "kind": self.kind,
            "command": self.argv,
            "cwd": self.cwd or recipes.run_dir(run_id),
            "env_dir": self.env_dir,
            "project": self.project,
            "setup": self.setup,
            "metrics": self.metrics,
            "job_file": self.job_file,
            "job_file_text": self.job_file_text,
        }

    @property
    def home_env(self) -> dict[str, str]:
        """Variables set to a folder under the worker's home (expanded there, at start)."""
        env = {"VIRTUAL_ENV": self.env_dir} if self.env_dir and self.kind == "command" else {}
        if self.cwd:
            env["TPU_CONSOLE_PROJECT_DIR"] = self.cwd
        return env

    @property
    def home_prepend(self) -> dict[str, str]:
        """Path lists a folder under the worker's home goes first in: the environment's bin on PATH, the
        project on PYTHONPATH (a command only: the trainer runs as it always has)."""
        if self.kind != "command":
            return {}
        paths = {"PATH": f"{self.env_dir}/bin"} if self.env_dir else {}
        if self.cwd:
            paths["PYTHONPATH"] = self.cwd
        return paths


def trainer_job(config: ValidatedConfig, interpreter: str) -> PreparedJob:
    """The built-in job: `PY -u -m trainer --config config.yaml --run-dir .` in the run folder."""
    return PreparedJob(
        kind="trainer",
        argv=[interpreter, "-u", *TRAINER_ARGS],
        source=str(config.path),
        digest=config.digest,
        python=interpreter,
        metrics=MetricsSpec().model_dump(),
        overrides=config.overrides,
        env_dir=ENV_DIR if interpreter == ENV_PYTHON else None,
        files={"config.yaml": config.yaml_text.encode()},
        config=config.data,
    )


def command_job(job: JobSpec, node: Node, reports: list[WorkerReport], check_code: bool) -> PreparedJob:
    """A command, in the project the workers hold (else the run folder), with their setup's environment
    (else bootstrap's, else none). Refused when the workers disagree on project, setup or Python."""
    if check_code and (differences := job_mismatches(reports)):
        raise UserError(
            f"the workers of {node.name} do not hold the same project and environment: "
            f"{'; '.join(differences)}; run `tpu-console sync {node.name}` (and the setup) again, or launch "
            "with --no-code-check"
        )
    project = reports[0].project if all(r.project for r in reports) else None
    setup = reports[0].setup if all(r.setup for r in reports) else None
    if job.project is not None and project is None:
        worker = next(r.worker for r in reports if not r.project)
        raise UserError(f"worker {worker} of {node.name} holds no project after the sync; nothing was "
                        "launched")
    if job.setup is not None and setup is None:
        worker = next(r.worker for r in reports if not r.setup)
        raise UserError(f"worker {worker} of {node.name} holds no setup after the setup ran; nothing was "
                        "launched")
    if not any(r.project for r in reports) and (named := project_path_in(job.command)) is not None:
        raise UserError(f"no project is synced to {node.name}, so `{named}` is not on its workers (a command "
                        f"without one runs in its run folder); run `tpu-console sync {node.name} --dir PATH` "
                        "first, or give absolute paths")
    if (stale := stale_setup(node.name, project, setup)) is not None:
        raise UserError(stale)
    env_dir = (setup or {}).get("env") or (ENV_DIR if all(r.env_present for r in reports) else None)
    return PreparedJob(
        kind="command",
        argv=list(job.command),
        source=job.job_file or shlex.join(job.command),
        digest=job.digest(),
        python=f"~/{env_dir}/bin/python" if env_dir else job.command[0],
        metrics=job.metrics.model_dump(),
        cwd=(project or {}).get("dir"),
        env_dir=env_dir,
        project=project,
        setup=setup,
        job_file=job.job_file,
        job_file_text=job.job_file_text,
    )


def refuse_unseen_hang(job: JobSpec, policy: SupervisionPolicy) -> None:
    """--max-hang is judged by the steps read from the job's output: with metrics format none there are
    none, so it could never stop the run."""
    if policy.max_hang_s is not None and job.metrics.format == "none":
        raise UserError("--max-hang stops a run that makes no step for that long, but metrics format none "
                        "reads no step; leave out --max-hang, or have the steps read (format auto, or a "
                        "regex)")


def job_mismatches(reports: list[WorkerReport]) -> list[str]:
    """What must agree across workers for a command: the project, the setup, the base Python, and the
    JAX versions of bootstrap's environment when the job runs in it (no setup)."""
    keys = {
        "project": lambda r: (r.project or {}).get("digest"),
        "setup": lambda r: (r.setup or {}).get("digest"),
        "python": lambda r: (r.python_info or {}).get("version"),
    }
    if not any(r.setup for r in reports):
        keys.update({name: (lambda r, n=name: r.versions.get(n)) for name in ("jax", "jaxlib", "libtpu")})
    lines = []
    for key, value in keys.items():
        values = {r.worker: value(r) for r in reports}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"worker {w}: {str(v)[:12] if v else 'none'}" for w, v in values.items())
            lines.append(f"{key} differs ({shown})")
    return lines


async def make_current(
    providers: dict[str, Provider],
    node_name: str,
    job: JobSpec,
    workers: list[int],
    progress: Callable[[str], None],
    on_worker: Callable[[int, str], None],
) -> None:
    """The job file's project and setup on every worker, by provisioning's own steps (which skip what is
    already there): `sync --dir/--git`, then the setup. A worker where one fails is named, and nothing is
    launched."""
    selection = ",".join(str(w) for w in workers)
    if job.project is not None:
        from tpu_console.provision.project_sync import sync_project

        synced = await sync_project(
            providers, node_name, directory=job.project_dir(), git_url=job.project.git,
            branch=job.project.branch, workers=selection, progress=progress, on_worker=on_worker,
        )
        refuse_failed_step(synced, "the project could not be synced")
    if job.setup is not None:
        from tpu_console.provision.project_setup import setup_project

        made = await setup_project(
            providers, node_name, command=job.setup.command, requirements=job.setup.requirements or (),
            python_version=job.setup.python, workers=selection, progress=progress, on_worker=on_worker,
        )
        refuse_failed_step(made, "the setup failed")


def refuse_failed_step(result: Any, what: str) -> None:
    """UserError naming the first worker where a provisioning step failed (a SetupResult)."""
    failed = [w for w in result.workers if not w.ok]
    if failed:
        names = ", ".join(str(w.worker) for w in failed)
        raise UserError(f"{what} on worker(s) {names} of {result.node.name}: {failed[0].error}; nothing was "
                        "launched")


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


@dataclass
class _TrainerKind:
    """The bundled trainer: a config checked against the node's shape; the model, the data and the
    checkpoint folder it names checked on every worker in the same round trip as the workers' state."""

    config: ValidatedConfig
    python: str | None
    fail_fast: bool
    check_code: bool
    before_send: Callable[[ValidatedConfig, Node], Awaitable[None]] | None
    command = False

    def __post_init__(self) -> None:
        self.needed = job_inputs(self.config.config)  # a malformed hub id or gs:// path is refused here

    def check_here(self, slices: Sequence[int] | None, policy: SupervisionPolicy | None) -> SupervisionPolicy:
        """What can be refused before any node is reached; the supervision policy the run gets."""
        if self.python is not None and not self.python.strip():
            raise UserError("--python is empty; give an interpreter, e.g. --python python3")
        return policy or SupervisionPolicy(fail_fast=self.fail_fast)

    async def check_node(self, seen: Node, selected: list[int]) -> None:
        """The config against the node's shape as the run sees it, then the caller's check (the plan's)."""
        check_shape(self.config, seen, len(selected))
        if self.before_send is not None:
            await self.before_send(self.config, seen)

    def job_env(self, envs: dict[int, dict[str, str]]) -> dict[int, dict[str, str]]:
        return envs

    async def prepare(self, provider: Provider, node: Node, fleet: Fleet, selected: list[int],
                      env_data: bytes | None) -> PreparedJob:
        reports = await inspect_workers(fleet, selected, also=recipes.check_inputs(
            [(i.key, i.path, i.need) for i in self.needed]))
        refuse_unready(node, reports, self.config, env_data, self.python, self.check_code)
        refuse_missing(node, self.needed, {r.worker: r.inputs for r in reports})
        return trainer_job(self.config, self.python or worker_python(provider, reports))


@dataclass
class _CommandKind:
    """Any command: in the project the workers hold, with their setup's environment; a job file's project
    and setup made current first."""

    job: JobSpec
    python: str | None
    check_code: bool
    providers: dict[str, Provider]
    progress: Callable[[str], None]
    on_worker: Callable[[int, str], None]
    command = True

    def check_here(self, slices: Sequence[int] | None, policy: SupervisionPolicy | None) -> SupervisionPolicy:
        """What can be refused before any node is reached; the supervision policy the run gets (the job
        file's `[supervisor]` unless the caller gives one)."""
        if self.python is not None:
            raise UserError("--python chooses the bundled trainer's interpreter; for a command, write the "
                            "interpreter in the command (-- python3 train.py)")
        if slices is not None and not self.job.elastic:
            raise UserError("this command is not elastic: it runs on some of a node's slices only when its "
                            "job file says `elastic = true` (it then reads its slice count, "
                            "TPU_CONSOLE_NUM_SLICES)")
        policy = policy or self.job.policy()
        refuse_unseen_hang(self.job, policy)
        return policy

    async def check_node(self, seen: Node, selected: list[int]) -> None:
        return None

    def job_env(self, envs: dict[int, dict[str, str]]) -> dict[int, dict[str, str]]:
        return {w: {**self.job.env, **env} for w, env in envs.items()}  # the names the console sets win

    async def prepare(self, provider: Provider, node: Node, fleet: Fleet, selected: list[int],
                      env_data: bytes | None) -> PreparedJob:
        reports = await inspect_workers(fleet, selected)
        refuse_live_runs(node, reports)
        if self.job.project is not None or self.job.setup is not None:
            # a job file names its code and environment: make them current first (cached: unchanged
            # project and setup cost a round trip each), then look again at what the workers hold
            await make_current(self.providers, node.name, self.job, selected, self.progress, self.on_worker)
            reports = await inspect_workers(fleet, selected)
            refuse_live_runs(node, reports)
        prepared = command_job(self.job, node, reports, self.check_code)
        stale = await asyncio.to_thread(stale_requirements, node.name, prepared.project, prepared.setup)
        if stale is not None:
            raise UserError(stale)
        if changed := await asyncio.to_thread(changed_since_sync, node.name, prepared.project):
            self.progress(f"warning: {changed}")  # not refused: the run is the synced copy, and says which
        return prepared


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
    Both go through the one preflight below; what differs per kind is in `_TrainerKind` / `_CommandKind`.

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
    a check of the caller's (the plan's fit, experiments/plan.py) that refuses by raising UserError.
    `slices` (a multislice node's slice indices, in order): run on every host of those slices only, as a
    run of that many slices (multislice.slices_env; the shape checks and `before_send` see that node), in
    place of `workers`; a command only when its job is `elastic`.
    """
    if (config_path is None) == (job is None):
        raise UserError("give one job: a trainer config (--config FILE), or a command (-- CMD ... or "
                        "--job FILE.toml), not both")
    kind: _TrainerKind | _CommandKind = (
        _TrainerKind(validate_config(config_path, overrides), python, fail_fast, check_code, before_send)
        if job is None else _CommandKind(job, python, check_code, providers, progress, on_worker))
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
        async with LaunchLock(fleet, node.name, selected[0]) as lock:
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
        price_per_hour=estimate.per_hour if estimate is not None else None,
    )
    record = RunRecord.from_launch(launch)
    bind, supervisor_host = provider.supervisor_address(node, targets)
    plan = supervision.plan(
        run_id=run_id, node=node.name, provider=node.provider, workers=selected,
        started_at=started.timestamp(), policy=policy,
        price_per_hour=estimate.per_hour if estimate is not None else None,
        delete_target=provider.supervisor_delete_target(node), bind=bind,
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
            await fleet.run(recipes.stop_supervisor(run_id), [selected[0]], timeout=30)
    _record(store, record, starts)
    return LaunchResult(run_id, node, selected, starts, prepared.digest, recipes.run_dir(run_id), job_record)


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
        recipes.prepare_run_dir(run_id, copy_env_from=None if env_data else SYNCED_ENV_FILE),
        workers,
        timeout=60,
    )
    problems = {r.worker: r.error or r.stderr.strip() or f"exit {r.exit_status}" for r in made if not r.ok}
    if problems:
        return problems
    folder = recipes.run_dir(run_id)
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
        uploads.append(fleet.put(recipes.RUNNER_SOURCE, f"{folder}/{RUNNER}", workers, mode=0o644))
        uploads.append(fleet.put(recipes.RUN_RECORD_SOURCE, f"{folder}/{RUN_RECORD}", workers, mode=0o644))
        uploads.append(fleet.put(recipes.STEP_LINES_SOURCE, f"{folder}/{STEP_LINES}", workers, mode=0o644))
        uploads.append(fleet.put(recipes.LOG_TIMESTAMPS_SOURCE, f"{folder}/{LOG_TIMESTAMPS}", workers,
                                 mode=0o644))
        uploads.append(fleet.put(recipes.PREEMPTION_NOTICE_SOURCE, f"{folder}/{PREEMPTION_NOTICE}", workers,
                                 mode=0o644))
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
    fleet: Fleet, run_id: str, workers: list[int], envs: dict[int, dict[str, str]], prepared: PreparedJob,
    runner_python: str,
) -> list[WorkerStart]:
    job_args = (RUNNER, "--", *prepared.argv)  # the runner starts it in launch.json's job "cwd"

    async def start_one(worker: int) -> WorkerStart:
        command = recipes.start_detached(
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


def refuse_unready(
    node: Node,
    reports: list[WorkerReport],
    config: ValidatedConfig,
    env_data: bytes | None,
    python: str | None,
    check_code: bool,
) -> None:
    """UserError when the workers are not ready for this launch; see `launch` for what is checked."""
    refuse_live_runs(node, reports)
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


def refuse_live_runs(node: Node, reports: list[WorkerReport]) -> None:
    live = {run_id: r.worker for r in reports for run_id in r.live_runs}
    if live:
        run_id, worker = next(iter(live.items()))
        raise UserError(
            f"run {run_id} is still running on {node.name} (worker {worker}); stop it first with "
            f"`tpu-console stop {node.name} {run_id}`"
        )


async def clear_stale_holders(
    fleet: Fleet, workers: list[int], on_worker: Callable[[int, str], None]
) -> None:
    """Kill leftover TPU holders and remove libtpu's lockfile on every worker (what `--kill-stale` asks)."""
    await run_on_workers(fleet, provision_recipes.kill_stale(), workers, timeout=60, on_worker=on_worker)
