"""The job a managed run runs, kept so it can be launched again on a new node, exactly as at first: the
bundled trainer's config (path, `--set` overrides, and its full text should the path be gone) or the
command (the job file's spec), the `.env` path, the interpreter, every supervisor option; the code (the
console's checkout wheel for the trainer; the project, by its folder or git and digest) and the setup.

`job_of_trainer` / `job_of_command` make the record at hand-over (launch --managed, a job file's
`[recovery]`); `prepare` and `launch_again` use it on each new incarnation, on whichever machine the
controller runs: a project synced from a folder comes from its snapshot in the controller's store
(snapshot.py), the `.env` from the controller's own copy (env_copies.py). `blocked` says why a controller
cannot take the next step of a run (a local pod of another console home, no `.env`, no snapshot).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.controller import env_copies, snapshot
from tpu_console.controller.state import Action, ManagedRun
from tpu_console.controller.store import StateStore
from tpu_console.errors import UserError
from tpu_console.history import ownership
from tpu_console.history.store import RunStore
from tpu_console.launch.job_kinds import ValidatedConfig
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.start import LaunchResult, launch
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.providers.base import Progress, Provider, no_progress


def job_of_trainer(config: ValidatedConfig, env_file: str | None, python: str | None,
                   policy: SupervisionPolicy, check_code: bool = True, check_ports: bool = True,
                   bootstrap: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "trainer", "config_path": str(config.path.resolve()), "overrides": list(config.overrides),
            "config_yaml": config.yaml_text, "config_digest": config.digest,
            "env_file": str(Path(env_file).resolve()) if env_file else None, "python": python,
            "policy": dataclasses.asdict(policy), "check_code": check_code, "check_ports": check_ports,
            "bootstrap": bootstrap or {}}


def job_of_command(job: JobSpec, env_file: str | None, policy: SupervisionPolicy,
                   check_code: bool = True, check_ports: bool = True) -> dict[str, Any]:
    spec = job.model_dump(mode="json")
    if job.project_dir() is not None:  # absolute, so it does not depend on where the controller runs from
        spec["project"] = {**spec["project"], "dir": str(job.project_dir())}
    return {"kind": "command", "spec": spec, "job_file": job.job_file, "job_file_text": job.job_file_text,
            "env_file": str(Path(env_file).resolve()) if env_file else None,
            "policy": dataclasses.asdict(policy), "check_code": check_code, "check_ports": check_ports}


def policy_of(job: dict[str, Any]) -> SupervisionPolicy:
    fields = {**job["policy"], "restart_on": tuple(job["policy"].get("restart_on") or ())}
    return SupervisionPolicy(**fields)


def project_of(node: str, launched: dict[str, Any] | None) -> dict[str, Any] | None:
    """The project the first run's workers held, to sync again: its git source, or the folder this console
    synced it from (its sync record), with the digest the same code must have."""
    project = (launched or {}).get("project")
    if not project:
        return None
    if project.get("url"):
        return {"git": project["url"], "branch": project.get("branch"), "digest": project.get("digest")}
    record = locations.home() / "synced" / f"{node}.json"
    try:
        synced = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if synced.get("digest") != project.get("digest"):
        return None
    return {"dir": synced["dir"], "digest": project["digest"]}


def _config_path(run_id: str, job: dict[str, Any]) -> tuple[str, list[str]]:
    """The config to launch with: the file and overrides as given, else (the file moved, or the controller
    runs elsewhere) the full config as first launched, saved in the controller's home."""
    path = Path(job["config_path"])
    if path.is_file():
        from tpu_console.launch.job_kinds import validate_config

        try:
            if validate_config(path, job["overrides"]).digest == job.get("config_digest"):
                return str(path), list(job["overrides"])
        except UserError:
            pass
    saved = locations.home() / "controller" / "configs" / f"{run_id}.yaml"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(job["config_yaml"])
    return str(saved), []


async def prepare(providers: dict[str, Provider], node: str, job: dict[str, Any],
                  project: dict[str, Any] | None, setup: dict[str, Any] | None,
                  progress: Progress = no_progress,
                  bootstrapped: Callable[[], None] = lambda: None, store: StateStore | None = None) -> None:
    """Bootstrap the new node (then `bootstrapped()`) and sync the same code: the checkout wheel for the
    trainer, the project (by its digest: from its snapshot in `store` when it has one, else its folder,
    refused when changed since) and its setup for a command. Raises UserError."""
    from tpu_console.provision.bootstrap import bootstrap_node
    from tpu_console.provision.code_sync import sync_node

    if job["kind"] == "trainer":
        _checked(await bootstrap_node(providers, node, progress=progress, **job.get("bootstrap", {})),
                 "bootstrap")
        bootstrapped()
        _checked(await sync_node(providers, node, progress=progress), "sync")
        return
    bootstrapped()  # a command runs in its project's setup, or the environment the node already has
    if project is not None and not job["spec"].get("project"):
        from tpu_console.provision.project_sync import sync_project

        if project.get("snapshot") and store is not None:
            packed = await asyncio.to_thread(snapshot.fetch, store, project)
            synced = await sync_project(providers, node, packed=packed, progress=progress)
        else:
            synced = await sync_project(providers, node, directory=project.get("dir"),
                                        git_url=project.get("git"), branch=project.get("branch"),
                                        progress=progress)
        _checked(synced, "project sync")
        digests = {(w.report.project or {}).get("digest") for w in synced.workers}
        if project.get("digest") and digests != {project["digest"]}:
            raise UserError(f"the project synced to {node} is now {sorted(map(str, digests))}, not the "
                            f"{project['digest']} the run started with: its folder changed")
    if setup is not None and not job["spec"].get("setup") and setup.get("command"):
        from tpu_console.provision.project_setup import setup_project

        made = await setup_project(providers, node, command=setup["command"],
                                   requirements=setup.get("requirements") or (),
                                   python_version=setup.get("python"), progress=progress)
        _checked(made, "setup")


def _checked(result: Any, what: str) -> None:
    failed = [w for w in result.workers if not w.ok]
    if failed:
        raise UserError(f"{what} failed on worker {failed[0].worker}: {failed[0].error}")


async def launch_again(providers: dict[str, Provider], run_id: str, node: str, job: dict[str, Any],
                       webhook_url: str | None = None, store: RunStore | None = None,
                       progress: Progress = no_progress, slices: Sequence[int] | None = None) -> LaunchResult:
    """Launch the job as first launched (every supervisor option), on every worker of `node`, or of its
    `slices` alone (a multislice that shrank or grew: controller/elastic.py)."""
    policy = policy_of(job)
    if job["kind"] == "trainer":
        config_path, overrides = _config_path(run_id, job)
        return await launch(providers, node, config_path, overrides, env_copies.env_file_for(run_id, job),
                            python=job.get("python"), check_code=job.get("check_code", True),
                            check_ports=job.get("check_ports", True), store=store, progress=progress,
                            policy=policy, webhook_url=webhook_url, slices=slices)
    spec = JobSpec.model_validate({**job["spec"], "job_file": job.get("job_file"),
                                   "job_file_text": job.get("job_file_text")})
    return await launch(providers, node, None, (), env_copies.env_file_for(run_id, job),
                        check_code=job.get("check_code", True), check_ports=job.get("check_ports", True),
                        store=store, progress=progress, policy=policy, webhook_url=webhook_url, job=spec,
                        slices=slices)


RELAUNCHING = (Action.CREATE, Action.PREPARE, Action.LAUNCH)  # the steps that need the job's inputs here


def blocked(run: ManagedRun, action: Action, store: StateStore) -> str | None:
    """Why this controller cannot take the run's next step, naming the fix; None when it can. A local
    pod's workers are folders of the console home that made it: no other home (another machine's, or a
    controller's own home started with `--on` on this one) can read, delete or make it. Making a node
    again waits for the `.env` (env_copies.py) and the project's snapshot (read into this home's cache)."""
    if run.provider == "local" and run.owner and not ownership.is_this_home(run.owner):  # none: from before
        owner = run.owner or {}
        return (f"{run.node} is a local pod of {owner.get('host', 'another machine')}, whose folders only a "
                "controller of the console that made it can reach; run `tpu-console controller start` "
                "there (and stop this one) to recover it")
    if action not in RELAUNCHING:
        return None
    if (why := env_copies.missing(run.id, run.job)) is not None:
        return why
    if run.project and run.project.get("snapshot"):
        try:
            snapshot.ensure(store, run.project)
        except UserError as exc:
            return str(exc)
    return None
