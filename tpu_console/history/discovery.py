"""Runs found on a node's workers: a run folder on the pod is the record of what ran, whoever launched it.

One round trip to the node's first worker prints the launch.json of each run folder the history lacks
(a colleague's run, one from before this home was wiped); each becomes a history entry (the history is a
cache of what was seen), and the usual probe then says how it stands. A node that cannot be reached
leaves the history's answer as it is."""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from tpu_console.errors import NotFound, UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.recipes import _MARK_PRINTF, MARK, RUNS_DIR
from tpu_console.history.run_id import is_run_id
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node

NEWEST = 50  # run folders looked at per node, newest first (run ids sort by their start)


def list_runs_recipe(known: Sequence[str], newest: int = NEWEST) -> str:
    """Print `<MARK>found <run id>` and its launch.json for each of the newest run folders not in
    `known`."""
    skip = " ".join(shlex.quote(run_id) for run_id in known)
    return (
        f'( cd "$HOME"/{shlex.quote(RUNS_DIR)} 2>/dev/null || exit 0\n'
        f"for id in $(ls -1 | sort -r | head -n {int(newest)}); do\n"
        f'  case " {skip} " in *" $id "*) continue;; esac\n'
        '  [ -f "$id/launch.json" ] || continue\n'
        f"  printf '{_MARK_PRINTF}found %s\\n' \"$id\"; cat \"$id/launch.json\"\n"
        "done\nexit 0 )"
    )


def parse_found(stdout: str) -> dict[str, dict[str, Any]]:
    """launch.json by run id; a folder whose name is not a run id or whose file is not JSON is left out."""
    found = {}
    for block in stdout.split(f"{MARK}found ")[1:]:
        run_id, _, text = block.partition("\n")
        try:
            launch = json.loads(text)
        except ValueError:
            continue
        if is_run_id(run_id.strip()) and isinstance(launch, dict):
            found[run_id.strip()] = launch
    return found


def record_from_launch(run_id: str, launch: dict[str, Any], node: str) -> RunRecord:
    """A history entry for a run seen only on its pod: what launch.json says, its state left to the probe."""
    job = launch.get("job") if isinstance(launch.get("job"), dict) else None
    command = (job or {}).get("command") or launch.get("command") or []
    code = launch.get("code_version")
    try:
        started = datetime.fromisoformat(str(launch.get("started_at")))
    except ValueError:
        started = datetime.now(UTC)
    return RunRecord(
        run_id=run_id,
        node=str(launch.get("node") or node),
        provider=str(launch.get("provider") or "?"),
        accelerator_type=str(launch.get("accelerator_type") or "?"),
        workers=[int(w) for w in launch.get("workers") or [] if isinstance(w, int)],
        config_path=str(launch.get("config_source") or (job or {}).get("job_file")
                        or shlex.join(map(str, command))),
        config_digest=str(launch.get("config_digest") or ""),
        overrides=[str(o) for o in launch.get("overrides") or []],
        python=str(launch.get("python") or ""),
        started_at=started,
        code_version=(str(code.get("git_sha") or "") + ("+dirty" if code.get("dirty") else "")
                      if isinstance(code, dict) else None),
        job=job,
        launched_by=launch.get("launched_by") if isinstance(launch.get("launched_by"), dict) else None,
        slices=launch["slices"] if isinstance(launch.get("slices"), int) and launch["slices"] > 0 else 1,
    )


async def discover(providers: dict[str, Provider], store: RunStore, node: str) -> list[str]:
    """Add the runs on `node`'s first worker that the history lacks; their ids (none when the node is
    gone or cannot be reached: the history stands). NotFound when no provider has such a node."""
    provider, found = await find_node(providers, node)
    if not found.state.is_usable:
        return []
    try:
        targets = await provider.ssh_targets(found)
    except UserError:
        return []  # no SSH access from here: the history stands
    if not targets:
        return []
    known = [r.run_id for r in store.list(node, 100_000)]
    first = min(targets, key=lambda t: t.worker)
    async with Fleet([first]) as fleet:  # the first worker alone: one connection, one round trip
        (result,) = await fleet.run(list_runs_recipe(known), [first.worker], timeout=60)
    if not result.ok:
        return []
    added = []
    for run_id, launch in parse_found(result.stdout).items():
        try:
            store.get(run_id)  # launched on another node of the same name, or seen meanwhile
        except NotFound:
            store.add(record_from_launch(run_id, launch, node))
            added.append(run_id)
    return added


async def discover_all(providers: dict[str, Provider], store: RunStore) -> int:
    """Every usable node's runs into the history at once (the runs screen); how many were new. A node
    that cannot be asked is left as the history knows it."""
    names = await _usable_nodes(providers)
    found = await asyncio.gather(*(discover(providers, store, n) for n in names), return_exceptions=True)
    return sum(len(f) for f in found if isinstance(f, list))


async def _usable_nodes(providers: dict[str, Provider]) -> list[str]:
    listings = await asyncio.gather(*(p.list_nodes() for p in providers.values()), return_exceptions=True)
    return sorted({n.name for listing in listings if not isinstance(listing, BaseException)
                   for n in listing.nodes if n.state.is_usable})


async def discover_run(providers: dict[str, Provider], store: RunStore, run_id: str) -> bool:
    """Look for `run_id` on every node's first worker (a run id this console never saw); True when found."""
    for name in await _usable_nodes(providers):
        try:
            if run_id in await discover(providers, store, name):
                return True
        except (NotFound, UserError):
            continue
    return False
