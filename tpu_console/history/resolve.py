"""Which run a person means: `RUN_ID`, `NODE` (its latest run) or `NODE RUN_ID`, as `status`, `stop`,
`logs`, `stacks` and `runs show` take them. The pod is the record of what ran (history/discovery.py): a
node's runs are read from its first worker into the history first, so its latest run may be a
colleague's; a run id the history lacks is looked for in the run records' bucket (history/bucket_record.py:
one whose node is gone), then on every node. Nothing is done on a node for a name that does not resolve."""

from __future__ import annotations

from tpu_console.errors import NotFound, UnknownNode, UserError, did_you_mean
from tpu_console.history import bucket_record, discovery
from tpu_console.history.run_id import check_run_id, is_run_id
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.providers.base import Provider
from tpu_console.settings import load_settings


async def resolve_run(
    store: RunStore, providers: dict[str, Provider], first: str, second: str | None = None
) -> RunRecord:
    first = first.strip()
    if second is not None:
        run_id = check_run_id(second)
        if not _known(store, run_id):
            await _discover(providers, store, first)
        record = await _get(store, providers, run_id)
        if record.node != first:
            raise UserError(
                f"run {record.run_id} ran on {record.node}, not {first}; "
                f"use `{record.node} {record.run_id}` or the run id alone"
            )
        return record
    if is_run_id(first):
        return await _get(store, providers, first)
    unknown = await _discover(providers, store, first)
    latest = store.list(first, 1)
    if latest:
        return latest[0]
    if unknown is not None:
        raise NotFound(
            f"{first!r} is neither a run id (YYYYmmdd-HHMMSS-xxxx) nor a node{did_you_mean(unknown.close)}; "
            "list them with `tpu-console runs` and `tpu-console ls`"
        )
    raise NotFound(f"node {first} has no runs yet; start one with `tpu-console launch {first} --config FILE`")


def _known(store: RunStore, run_id: str) -> bool:
    try:
        store.get(run_id)
    except NotFound:
        return False
    return True


async def _discover(providers: dict[str, Provider], store: RunStore, node: str) -> UnknownNode | None:
    """The node's runs into the history; the error when there is no such node (the history may still
    know it)."""
    try:
        await discovery.discover(providers, store, node)
    except UnknownNode as exc:
        return exc
    except NotFound:  # a provider could not be asked: no names to offer
        return UnknownNode(node, [])
    return None


async def _get(store: RunStore, providers: dict[str, Provider], run_id: str) -> RunRecord:
    """From the history; a run id it lacks is looked for in the bucket's records, then on the nodes."""
    try:
        return store.get(run_id)
    except NotFound:
        bucket_record.merge_into_history(load_settings(), store)
    try:
        return store.get(run_id)
    except NotFound:
        if not await discovery.discover_run(providers, store, run_id):
            raise
    return store.get(run_id)
