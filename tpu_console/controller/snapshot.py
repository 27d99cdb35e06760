"""A managed command's project, kept in the controller's store so that any controller syncs exactly the
code the run started with, without the folder it came from (which is on the laptop that launched it).

At hand-over (`keep`), the folder the project was synced from is packed again the way `sync --dir` packs
it (provision/project_sync.py: the same file list, the same digest) and, when its digest is still the
run's, its tarball is written once to the store as `projects/<digest>.tar.gz` (the bucket beside the
controller's state, or the folder standing for it). A recovery (`fetch`) reads it back into the
controller's home (`controller/projects/<digest>/<name>/`, kept for the next recovery), checks that the
files add up to the digest again, and syncs them as they are, digest and all.

A `.env` never goes with it: a project that holds the run's env file, or any file named `.env`, is refused
(the secret would be in the bucket), naming the fix.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.controller.store import StateStore
from tpu_console.errors import UserError
from tpu_console.provision.project_sync import PackedProject, digest_of, file_states, pack_project

FOLDER = "projects"


def object_name(digest: str) -> str:
    return f"{FOLDER}/{digest}.tar.gz"


def refuse_secrets(packed: PackedProject, env_file: str | None) -> None:
    """A project whose files include the run's `.env` (or any `.env`) is not copied into the store."""
    own = Path(env_file).resolve() if env_file else None  # a link to it is no copy of its secrets
    for relative in packed.files:
        path = packed.root / relative
        if path.name == ".env" or path == own:
            raise UserError(f"the project {packed.root} holds {relative}, a .env whose secrets would be "
                            "copied into the controller's store with the project; keep it outside the "
                            "folder (or name it in .gitignore)")


def keep(store: StateStore, project: dict[str, Any], env_file: str | None) -> dict[str, Any]:
    """The project record with its snapshot in the store (`snapshot`: the object's name), for a project
    synced from a folder; a git project as it is. UserError when the folder is gone or changed since the
    run's code was synced from it (that code could not be synced again), or holds a `.env`."""
    if not project.get("dir"):
        return project
    folder, digest = project["dir"], project["digest"]
    packed = pack_project(folder)
    if packed.digest != digest:
        raise UserError(f"{folder} has changed since the run's code {digest} was synced from it (it is "
                        f"{packed.digest} now), so no controller could sync that code again")
    refuse_secrets(packed, env_file)
    name = object_name(digest)
    store.put_file(name, packed.tarball())
    return {**project, "name": packed.root.name, "snapshot": name}


def _cache(digest: str) -> Path:
    return locations.home() / "controller" / FOLDER / digest


def fetch(store: StateStore, project: dict[str, Any]) -> PackedProject:
    """The project's snapshot, unpacked in this controller's home (read from the store the first time),
    its files adding up to the run's digest; UserError naming what is missing or wrong."""
    digest, name = project["digest"], project["snapshot"]
    cache = _cache(digest)
    manifest = cache / "files.json"
    if not manifest.is_file():
        data = store.get_file(name)
        if data is None:
            raise UserError(f"the project snapshot {name} is not in {store.place}; launch the run again "
                            "from the console that has its folder")
        _unpack(data, cache, project.get("name") or "project")
    files = json.loads(manifest.read_text())
    root = cache / files["root"]
    states = file_states(root, files["files"])
    if digest_of(states) != digest:
        shutil.rmtree(cache, ignore_errors=True)  # read again from the store next time
        raise UserError(f"the project snapshot {name} does not add up to {digest}; it is read again at "
                        "the next try")
    return PackedProject(root, list(files["files"]), digest, None, None, states)


def ensure(store: StateStore, project: dict[str, Any]) -> None:
    """The snapshot in this controller's home (read from the store, and checked, if it is not yet);
    UserError as `fetch`. Cheap once it is there: a recovery waiting to make its node asks every pass."""
    if not (_cache(project["digest"]) / "files.json").is_file():
        fetch(store, project)


def _unpack(data: bytes, cache: Path, name: str) -> None:
    """Unpack into cache/<name>/ and write cache/files.json (the file list, last: the cache is complete)."""
    partial = cache.with_name(cache.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    root = partial / name
    root.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        members = tar.getmembers()
        tar.extractall(root, filter="tar")  # no absolute paths, nothing outside the folder; modes kept
    files = sorted(m.name for m in members if not m.isdir())
    (partial / "files.json").write_text(json.dumps({"root": name, "files": files}))
    shutil.rmtree(cache, ignore_errors=True)
    partial.replace(cache)
