"""`tpu-console sync NODE`: the same code on every worker, and the `.env` beside it.

Two ways (by hand this is a git clone + pip install on each worker):
- from this checkout (the default): build a wheel of exactly what is on disk here, uncommitted changes
  included, upload it to every worker over SFTP and install it into `~/tpu-console/env` (no dependencies:
  bootstrap put those there). `code.json` records the git sha, the dirty flag and the wheel's digest.
- `--git URL --branch B`: any repository, cloned on every worker into `~/tpu-console/projects/<sha>/` and
  made the current project (tpu_console/provision/project_sync.py); a clone of this project is also
  installed into the environment, as the wheel would be.

`launch` compares `code.json` and the JAX versions across workers and refuses a mixed pod.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import secrets
from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.providers.base import Progress, Provider, no_progress
from tpu_console.provision import worker_recipes
from tpu_console.provision.report import WorkerReport
from tpu_console.provision.steps import OnWorker, SetupResult, WorkerSetup, ignore_worker, run_on_workers

ENV_FILE = worker_recipes.ENV_FILE  # where sync puts the secrets; launch copies them into each run
SYNC_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Wheel:
    path: Path
    sha256: str
    git_sha: str | None
    dirty: bool | None

    def code_json(self) -> str:
        return json.dumps(
            {
                "source": "wheel",
                "git_sha": self.git_sha,
                "dirty": self.dirty,
                "wheel": self.path.name,
                "wheel_sha256": self.sha256,
                "synced_at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
            sort_keys=True,
        )


def find_checkout() -> Path:
    """The source tree this console runs from (the folder holding pyproject.toml and tpu_console/)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file() or not (root / "trainer").is_dir():
        raise UserError(
            f"tpu-console is not running from a source checkout ({root} has no pyproject.toml); "
            "sync from a checkout, or use --git URL --branch B"
        )
    return root


def code_version(cwd: Path | None = None) -> dict[str, Any] | None:
    """`{"git_sha": ..., "dirty": bool}` of the git checkout the console runs in, or None outside one."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha, "dirty": bool(status) if status is not None else None}


def build_wheel(source: Path, out_dir: Path) -> Wheel:
    """A wheel of `source` as it is on disk (hatchling honours .gitignore, so .venv and caches stay out)."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--quiet",
        "--disable-pip-version-check",
        "-w",
        str(out_dir),
        str(source),
    ]
    try:
        import hatchling  # noqa: F401 - present: build here, without fetching a build environment

        command.insert(4, "--no-build-isolation")
    except ImportError:
        pass
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    wheels = sorted(out_dir.glob("tpu_console-*.whl"))
    if done.returncode != 0 or not wheels:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise UserError(
            f"building the wheel of {source} failed: {said[-1] if said else done.returncode}; "
            "run `pip wheel --no-deps .` there to see why"
        )
    version = code_version(source)
    digest = hashlib.sha256(wheels[-1].read_bytes()).hexdigest()
    return Wheel(
        wheels[-1], digest, version["git_sha"] if version else None, version["dirty"] if version else None
    )


async def sync_node(
    providers: dict[str, Provider],
    node_name: str,
    *,
    workers: str = "all",
    env_file: str | Path | None = None,
    git_url: str | None = None,
    branch: str | None = None,
    source: Path | None = None,
    progress: Progress = no_progress,
    on_worker: OnWorker = ignore_worker,
) -> SetupResult:
    """Install the code (and upload `env_file` as `~/tpu-console/.env`, mode 0600) on the selected workers."""
    if (git_url is None) != (branch is None):
        raise UserError("--git and --branch go together: --git URL --branch main")
    if git_url is not None:
        from tpu_console.provision.project_sync import sync_project

        return await sync_project(
            providers, node_name, git_url=git_url, branch=branch, workers=workers, env_file=env_file,
            progress=progress, on_worker=on_worker,
        )
    env_data = secrets.read_env_file(env_file) if env_file is not None else None
    provider, node = await open_node(providers, node_name)
    selected = parse_worker_selection(workers, node.shape.workers)
    targets = await provider.ssh_targets(node)
    masker = secrets.SecretMasker.from_env_bytes(env_data)
    async with Fleet(targets) as fleet:
        await require_all_reachable(fleet, node_name, selected, "nothing was synced")
        with tempfile.TemporaryDirectory(prefix="tpu-console-wheel-") as tmp:
            checkout = source or find_checkout()
            progress(f"{node.name}: building a wheel of {checkout}")
            wheel = await asyncio.to_thread(build_wheel, checkout, Path(tmp))
            state = "uncommitted changes included" if wheel.dirty else "clean"
            progress(
                f"{node.name}: {wheel.path.name} at {str(wheel.git_sha or 'no git')[:12]} ({state}), "
                f"uploading to {len(selected)} worker(s)"
            )
            uploads = await fleet.put(wheel.path, f"{worker_recipes.WHEELS_DIR}/{wheel.path.name}", selected)
            command = worker_recipes.install_wheel(wheel.path.name, wheel.code_json())
            failed = {r.worker: r.error or "upload failed" for r in uploads if not r.ok}
            if env_data is not None:
                put = await fleet.put(env_data, ENV_FILE, selected, mode=0o600)
                failed.update({r.worker: r.error or "upload of .env failed" for r in put if not r.ok})
                secrets.remember_env_file(node.name, env_file or "")
            ready = [w for w in selected if w not in failed]
            setups = (
                await run_on_workers(
                    fleet, command, ready, timeout=SYNC_TIMEOUT_S, on_worker=on_worker, masker=masker
                )
                if ready
                else []
            )
    setups += [WorkerSetup(w, False, error, WorkerReport(w), 0.0) for w, error in failed.items()]
    return SetupResult(node, sorted(setups, key=lambda s: s.worker))
