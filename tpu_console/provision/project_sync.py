"""`tpu-console sync NODE --dir PATH | --git URL --branch B`: your project's code on every worker.

- `--dir PATH`: the files git tracks there plus the untracked ones it does not ignore (outside a
  repository: every file but those a .gitignore names), packed once here into a tarball whose name is the
  digest of their content, uploaded once per worker and unpacked into `~/tpu-console/projects/<digest>/`.
  A worker that has that folder already is not sent anything: an unchanged re-sync costs one round trip,
  and a run's code never changes under it.
- `--git URL --branch B`: every worker clones the commit B is at into `projects/<sha>/` (again: once).

Both write `project.json`, the current project, which `setup` and `launch` read. The bundled trainer's
own sync (a wheel into ~/tpu-console/env, code.json) is tpu_console/provision/code_sync.py.

A `--dir` sync is also remembered here (`$TPU_CONSOLE_HOME/synced/<node>.json`: the folder, its digest and
each file's size, mtime and hash), so that `launch` can say when the folder has changed since
(`changed_since_sync`): the folder's digest is computed again the way sync computes it, reading only the
files whose size, mtime or mode moved. `project_path_in` finds the file a command names by a relative
path, which only a synced project holds (launch refuses such a command where nothing is synced).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import shlex
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import locations, secrets
from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.providers.base import Progress, Provider, no_progress
from tpu_console.provision import project_recipes
from tpu_console.provision.report import WorkerReport
from tpu_console.provision.steps import OnWorker, SetupResult, WorkerSetup, ignore_worker, run_on_workers
from tpu_console.provision.worker_recipes import ENV_FILE, PROJECTS_DIR

SYNC_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class PackedProject:
    """A project folder as it will be on the workers: its files, their digest, and where it came from."""

    root: Path
    files: list[str]  # relative paths, sorted
    digest: str
    git_sha: str | None
    dirty: bool | None
    states: dict[str, list[Any]] = field(default_factory=dict)  # file_states: what the digest adds up

    def project_json(self) -> str:
        return json.dumps(
            {
                "source": "dir",
                "digest": self.digest,
                "dir": f"{PROJECTS_DIR}/{self.digest}",
                "name": self.root.name,
                "git_sha": self.git_sha,
                "dirty": self.dirty,
                "url": None,
                "branch": None,
                "synced_at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
            sort_keys=True,
        )

    def tarball(self) -> bytes:
        """The files as a gzipped tar, in a fixed order, with fixed owners and times."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
            for relative in self.files:
                info = tar.gettarinfo(self.root / relative, arcname=relative)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isfile():
                    with open(self.root / relative, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
        return buffer.getvalue()


def _git(folder: Path, *args: str, git_dir: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    prefix = ["git", f"--git-dir={git_dir}", f"--work-tree={folder}"] if git_dir else ["git"]
    try:
        return subprocess.run(
            [*prefix, *args], cwd=folder, capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise UserError(f"git could not list the files of {folder} ({exc}); install git") from None


def project_files(root: Path) -> tuple[list[str], str | None, bool | None]:
    """The files to send from `root`, and its git sha and dirty flag (None, None outside a repository).

    In a repository: what git tracks under `root` plus what it does not ignore, as `sync` does for this
    checkout. Outside one: every file but the ignored ones, by the same rules (a throwaway git index that
    reads the folder's .gitignore files; the folder itself is not touched)."""
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    listing = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    if inside.returncode == 0 and inside.stdout.strip() == b"true":
        listed = _git(root, *listing)
        sha = _git(root, "rev-parse", "HEAD").stdout.decode().strip() or None
        status = _git(root, "status", "--porcelain", "--untracked-files=no", "--", ".")
        dirty: bool | None = bool(status.stdout.strip()) if status.returncode == 0 else None
    else:
        with tempfile.TemporaryDirectory(prefix="tpu-console-index-") as git_dir:
            init = subprocess.run(
                ["git", "init", "-q", "--bare", git_dir], capture_output=True, timeout=60, check=False
            )
            if init.returncode != 0:
                raise UserError(f"git init failed ({init.stderr.decode().strip()}); install git")
            listed = _git(root, "ls-files", "-z", "--others", "--exclude-standard", git_dir=Path(git_dir))
        sha, dirty = None, None
    if listed.returncode != 0:
        said = listed.stderr.decode(errors="replace").strip().splitlines()
        raise UserError(f"git could not list the files of {root}: {said[-1] if said else listed.returncode}")
    names = sorted({n for n in listed.stdout.decode().split("\0") if n})
    # Tracked files deleted on disk are left out (they would be missing on the workers too).
    files = [n for n in names if os.path.lexists(root / n) and not (root / n).is_dir()]
    return files, sha, dirty


def content_digest(root: Path, files: list[str]) -> str:
    """The digest of what the workers will hold: each file's path, executable bit and content (a
    symlink: its target), in order. Equal trees, equal digests, whatever their mtimes."""
    return digest_of(file_states(root, files))


def file_states(
    root: Path, files: list[str], known: dict[str, list[Any]] | None = None
) -> dict[str, list[Any]]:
    """Each file's `[size, mtime_ns, mode, kind, data]`, kind `x` or `f` (executable or not) with data the
    content's sha256, or `l` with data a symlink's target. An entry of `known` whose size, mtime and mode
    are those on disk is taken as it is, without reading the file (a stat cache, as git's index is)."""
    known = known or {}
    states: dict[str, list[Any]] = {}
    for relative in files:
        path = root / relative
        seen = path.lstat()
        was = known.get(relative)
        if was and was[:3] == [seen.st_size, seen.st_mtime_ns, seen.st_mode]:
            states[relative] = was
            continue
        if stat.S_ISLNK(seen.st_mode):
            kind, data = "l", os.readlink(path)
        else:
            kind = "x" if os.access(path, os.X_OK) else "f"
            data = hashlib.sha256(path.read_bytes()).hexdigest()
        states[relative] = [seen.st_size, seen.st_mtime_ns, seen.st_mode, kind, data]
    return states


def digest_of(states: dict[str, list[Any]]) -> str:
    """content_digest of the files `states` describes, in their order."""
    total = hashlib.sha256()
    for relative, (*_, kind, data) in states.items():
        raw = data.encode() if kind == "l" else bytes.fromhex(data)
        total.update(f"{relative}\0{kind}\0".encode() + raw + b"\0")
    return total.hexdigest()[:16]


def pack_project(directory: str | Path) -> PackedProject:
    """Read `directory` into a PackedProject, or a one-line UserError for a folder there is nothing to take
    from."""
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise UserError(f"--dir {directory}: no such directory here; give the folder of your project")
    root = root.resolve()
    files, sha, dirty = project_files(root)
    if not files:
        raise UserError(f"--dir {directory} has no files to sync (all ignored, or empty)")
    states = file_states(root, files)
    return PackedProject(root, files, digest_of(states), sha, dirty, states)


def repository_name(url: str) -> str:
    """`https://github.com/o/nash-mhc.git` -> `nash-mhc`."""
    tail = url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1]
    return tail.removesuffix(".git") or "project"


async def sync_project(
    providers: dict[str, Provider],
    node_name: str,
    *,
    directory: str | Path | None = None,
    git_url: str | None = None,
    branch: str | None = None,
    packed: PackedProject | None = None,
    workers: str = "all",
    env_file: str | Path | None = None,
    progress: Progress = no_progress,
    on_worker: OnWorker = ignore_worker,
) -> SetupResult:
    """Make a project the current one on the selected workers (`report.project` of each is its
    project.json): a folder, a git branch, or a folder already `packed` (a managed run's snapshot,
    controller/snapshot.py). Bad input raises UserError before any worker is touched."""
    if [directory, git_url, packed].count(None) != 2:
        raise UserError("give the project as --dir PATH or as --git URL --branch B (one of them)")
    if git_url is not None and not branch:
        raise UserError("--git and --branch go together: --git URL --branch main")
    if directory is not None:
        packed = await asyncio.to_thread(pack_project, directory)
    env_data = secrets.read_env_file(env_file) if env_file is not None else None
    provider, node = await open_node(providers, node_name)
    selected = parse_worker_selection(workers, node.shape.workers)
    targets = await provider.ssh_targets(node)
    masker = secrets.SecretMasker.from_env_bytes(env_data)
    failed: dict[int, str] = {}
    async with Fleet(targets) as fleet:
        await require_all_reachable(fleet, node_name, selected, "nothing was synced")
        if env_data is not None:
            put = await fleet.put(env_data, ENV_FILE, selected, mode=0o600)
            failed.update({r.worker: r.error or "upload of .env failed" for r in put if not r.ok})
            secrets.remember_env_file(node.name, env_file or "")
        ready = [w for w in selected if w not in failed]
        if packed is None:
            url = git_url or ""
            progress(f"{node.name}: cloning {branch} of {url} on {len(ready)} worker(s)")
            command = project_recipes.clone_project(url, branch or "", repository_name(url))
            setups = await _run(fleet, command, ready, on_worker, masker)
            unknown = [s for s in setups if (s.report.error or "").startswith("no branch or tag")]
            if unknown:
                first = unknown[0]
                raise UserError(f"worker {first.worker}: {first.report.error}; give one the repository has")
        else:
            setups = await _sync_packed(fleet, packed, ready, node.name, progress, on_worker, masker)
            if any(s.ok for s in setups):
                await asyncio.to_thread(remember_sync, node.name, packed)
    setups += [WorkerSetup(w, False, error, WorkerReport(w), 0.0) for w, error in failed.items()]
    return SetupResult(node, sorted(setups, key=lambda s: s.worker))


async def _sync_packed(
    fleet: Fleet,
    packed: PackedProject,
    workers: list[int],
    node_name: str,
    progress: Progress,
    on_worker: OnWorker,
    masker: secrets.SecretMasker,
) -> list[WorkerSetup]:
    """One round trip to learn which workers lack the tree (and to switch the others to it); the tarball
    then goes to those alone."""
    state = "uncommitted changes included" if packed.dirty else "clean" if packed.git_sha else "no git"
    progress(f"{node_name}: {packed.root} ({len(packed.files)} files, {state}) is {packed.digest}")
    project_json = packed.project_json()
    first = await _run(fleet, project_recipes.use_project(packed.digest, project_json), workers, on_worker,
                       masker)
    done = [s for s in first if s.ok]
    lacking = [s.worker for s in first if not s.ok and s.report.project_missing]
    broken = [s for s in first if not s.ok and s.worker not in lacking]
    if not lacking:
        return done + broken
    data = await asyncio.to_thread(packed.tarball)
    progress(f"{node_name}: uploading {len(data) / 1e6:.1f} MB to {len(lacking)} worker(s)")
    tarball = f"{project_recipes.UPLOAD_DIR}/{packed.digest}.tar.gz"
    uploads = await fleet.put(data, tarball, lacking)
    refused = {r.worker: r.error or "upload failed" for r in uploads if not r.ok}
    unpacked = await _run(
        fleet, project_recipes.unpack_project(packed.digest, tarball, project_json),
        [w for w in lacking if w not in refused], on_worker, masker,
    )
    refused_setups = [WorkerSetup(w, False, e, WorkerReport(w), 0.0) for w, e in refused.items()]
    return done + broken + unpacked + refused_setups


async def _run(
    fleet: Fleet, command: str, workers: list[int], on_worker: OnWorker, masker: secrets.SecretMasker
) -> list[WorkerSetup]:
    if not workers:
        return []
    return await run_on_workers(fleet, command, workers, timeout=SYNC_TIMEOUT_S, on_worker=on_worker,
                                masker=masker)


def project_summary(project: dict[str, Any] | None) -> str:
    """One word for a worker's project: `nash-mhc 1f2e3d4c5b6a7980`, `-` when none."""
    if not project:
        return "-"
    return f"{project.get('name') or '?'} {str(project.get('digest') or '')[:16]}"


def _sync_record(node_name: str) -> Path:
    return locations.home() / "synced" / f"{node_name}.json"


def remember_sync(node_name: str, packed: PackedProject) -> None:
    """Note which folder was synced to the node, as what digest, with its files' states."""
    record = {"dir": str(packed.root), "digest": packed.digest, "files": packed.states}
    path = _sync_record(node_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(record))
    partial.replace(path)


def _synced(node_name: str, digest: str | None) -> dict[str, Any] | None:
    """What remember_sync noted for the node, when it is the project `digest`; else None (another console
    or `--git` put that project there: nothing is known of it here)."""
    try:
        record = json.loads(_sync_record(node_name).read_text())
    except (OSError, ValueError):
        return None
    return record if digest and isinstance(record, dict) and record.get("digest") == digest else None


def synced_file_hashes(node_name: str, digest: str | None) -> dict[str, str | None] | None:
    """Each file's sha256 (None for a symlink) of the project this console synced to the node as `digest`,
    or None when it did not."""
    record = _synced(node_name, digest)
    if record is None:
        return None
    files = record.get("files") or {}
    return {name: None if state[3] == "l" else state[4] for name, state in files.items()}


def changed_since_sync(node_name: str, project: dict[str, Any] | None) -> str | None:
    """A warning when the folder the workers' current project was synced from (by this console) differs
    from it now: which files changed, and the sync that sends them. None when it has not changed, or when
    this console did not sync that project (nothing here to compare)."""
    record = _synced(node_name, (project or {}).get("digest"))
    root = Path(record["dir"]) if record and record.get("dir") else None
    if record is None or root is None or not root.is_dir():
        return None
    try:
        files, _, _ = project_files(root)
        states = file_states(root, files, record.get("files"))
    except (UserError, OSError):
        return None
    before: dict[str, list[Any]] = record.get("files") or {}
    if digest_of(states) == record["digest"]:
        if states != before:  # touched, not changed: keep the new mtimes so the next look reads nothing
            remember_sync(node_name, PackedProject(root, files, record["digest"], None, None, states))
        return None
    changed = sorted(set(states) ^ set(before)) + sorted(
        name for name in set(states) & set(before) if states[name][3:] != before[name][3:])
    named = changed[0] + (f" and {len(changed) - 1} more" if len(changed) > 1 else "") if changed else "?"
    return (f"{root} has changed since it was synced to {node_name} ({named}); this run uses the synced copy "
            f"{record['digest']}: `tpu-console sync {node_name} --dir {shlex.quote(str(root))}` sends the "
            "changes")


# Endings of the files a command names that belong to a project (scripts, configs, data lists).
PROJECT_FILE_SUFFIXES = (".py", ".sh", ".ipynb", ".yaml", ".yml", ".toml", ".json", ".jsonl", ".cfg", ".txt")


def project_path_in(command: Sequence[str]) -> str | None:
    """The first word of `command` (of a `bash -c` script too) that names a file by a path relative to
    the folder it runs in (`train.py`, `scripts/run.sh`, `--config=configs/a.yaml`), or None. Absolute
    paths, `~`, `$VARIABLES`, URLs and options are not such words."""
    for argument in command:
        try:
            words = shlex.split(argument) if any(c.isspace() for c in argument) else [argument]
        except ValueError:
            words = argument.split()
        for word in words:
            if word.startswith("-"):
                word = word.partition("=")[2]
            word = word.rstrip(";")
            if not word or word[0] in "/~$" or word[0].isdigit() or "://" in word or "=" in word:
                continue
            if "/" in word or word.endswith(PROJECT_FILE_SUFFIXES):
                return word
    return None
