"""The kinds of job `launch` starts, and what each must pass before it starts: the bundled trainer (a config
checked against the node's shape; the model, the data and the checkpoint folder on every worker) and any
command (in the project the workers hold, with their setup's environment). `launch` (launch/start.py) runs
one preflight for both; a kind says what is refused before any node is reached (`check_here`), against
the node (`check_node`), and, from what the workers hold, the job as every worker runs it (`prepare`)."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.launch.inputs import job_inputs, refuse_missing
from tpu_console.launch.job_spec import JobSpec, MetricsSpec
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.providers.base import Provider
from tpu_console.provision.project_setup import stale_requirements, stale_setup
from tpu_console.provision.project_sync import changed_since_sync, project_path_in
from tpu_console.provision.report import WorkerReport, mismatches
from tpu_console.provision.worker_inspection import inspect_workers, worker_python
from tpu_console.provision.worker_recipes import ENV_DIR, ENV_PYTHON
from tpu_console.secrets import parse_env

TRAINER_ARGS = ("-m", "trainer", "--config", "config.yaml", "--run-dir", ".")


@dataclass(frozen=True)
class ValidatedConfig:
    path: Path
    overrides: list[str]
    yaml_text: str  # config.yaml as the trainer reads it: every key, defaults included
    data: dict[str, Any]
    digest: str  # the trainer's own digest, the same its `start` event reports
    config: Any  # the trainer's TrainerConfig, for the checks against the node's shape


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
            "cwd": self.cwd or run_recipes.run_dir(run_id),
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


@dataclass
class TrainerKind:
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
        reports = await inspect_workers(fleet, selected, also=run_recipes.check_inputs(
            [(i.key, i.path, i.need) for i in self.needed]))
        refuse_unready(node, reports, self.config, env_data, self.python, self.check_code)
        refuse_missing(node, self.needed, {r.worker: r.inputs for r in reports})
        return trainer_job(self.config, self.python or worker_python(provider, reports))


@dataclass
class CommandKind:
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
