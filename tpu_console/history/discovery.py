"""Runs found on a node's workers: a run folder on the pod is the record of what ran, whoever launched it.

One round trip to the node's first worker prints the launch.json of each run folder the history lacks
(a colleague's run, one from before this home was wiped); each, read by the run record's one schema
(worker/run_record.py), becomes a history entry (the history is a cache of what was seen), and the usual
probe then says how it stands. A node that cannot be reached leaves the history's answer as it is; a
record this console is too old to read is left out of listings, and named when that run is asked for."""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from typing import Any

from tpu_console.errors import NotFound, UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.run_recipes import _MARK_PRINTF, MARK, RUNS_DIR
from tpu_console.history.run_id import is_run_id
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node
from tpu_console.worker.run_record import LaunchRecord, RecordError

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


def parse_found(stdout: str, node: str) -> dict[str, LaunchRecord | RecordError]:
    """Each run folder's record by run id, or why it cannot be read (not JSON, a newer schema); a folder
    whose name is not a run id is left out."""
    found: dict[str, LaunchRecord | RecordError] = {}
    for block in stdout.split(f"{MARK}found ")[1:]:
        run_id, _, text = block.partition("\n")
        run_id = run_id.strip()
        if not is_run_id(run_id):
            continue
        try:
            found[run_id] = LaunchRecord.loads(text, run_id, node)
        except RecordError as exc:
            found[run_id] = exc
    return found


def record_from_launch(run_id: str, launch: dict[str, Any], node: str) -> RunRecord:
    """A history entry for a run seen only on its pod: what launch.json (as parsed) says, its state left to
    the probe. RecordError when it cannot be read."""
    return RunRecord.from_launch(LaunchRecord.from_json(launch, run_id, node))


async def discover(providers: dict[str, Provider], store: RunStore, node: str,
                   unreadable: dict[str, str] | None = None) -> list[str]:
    """Add the runs on `node`'s first worker that the history lacks; their ids (none when the node is
    gone or cannot be reached: the history stands). NotFound when no provider has such a node. The runs
    whose record cannot be read go into `unreadable` with why."""
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
    for run_id, launch in parse_found(result.stdout, node).items():
        if isinstance(launch, RecordError):
            if unreadable is not None:
                unreadable[run_id] = str(launch)
            continue
        try:
            store.get(run_id)  # launched on another node of the same name, or seen meanwhile
        except NotFound:
            store.add(RunRecord.from_launch(launch))
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
    """Look for `run_id` on every node's first worker (a run id this console never saw); True when found.
    UserError when it is there with a record this console cannot read."""
    for name in await _usable_nodes(providers):
        unreadable: dict[str, str] = {}
        try:
            if run_id in await discover(providers, store, name, unreadable):
                return True
        except (NotFound, UserError):
            continue
        if run_id in unreadable:
            raise UserError(unreadable[run_id])
    return False
