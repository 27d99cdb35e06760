"""Which run a person means: `RUN_ID`, `NODE` (its latest run) or `NODE RUN_ID`, as `status`, `stop` and
`logs` take them. Looked up in the history, and for a run id it lacks in the run records' bucket
(runs/bucket_record.py: a colleague's run, one whose node is gone), so nothing is done on a node for a name
that does not resolve."""

from __future__ import annotations

from tpu_console.errors import NotFound, UserError
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node
from tpu_console.runs import bucket_record
from tpu_console.runs.run_id import check_run_id, is_run_id
from tpu_console.runs.store import RunRecord, RunStore
from tpu_console.settings import load_settings


async def resolve_run(
    store: RunStore, providers: dict[str, Provider], first: str, second: str | None = None
) -> RunRecord:
    first = first.strip()
    if second is not None:
        record = _get(store, check_run_id(second))
        if record.node != first:
            raise UserError(
                f"run {record.run_id} ran on {record.node}, not {first}; "
                f"use `{record.node} {record.run_id}` or the run id alone"
            )
        return record
    if is_run_id(first):
        return _get(store, first)
    latest = store.list(first, 1)
    if latest:
        return latest[0]
    try:
        await find_node(providers, first)
    except NotFound:
        raise NotFound(
            f"{first!r} is neither a run id (YYYYmmdd-HHMMSS-xxxx) nor a node; list them with "
            "`tpu-console runs` and `tpu-console ls`"
        ) from None
    raise NotFound(f"node {first} has no runs yet; start one with `tpu-console launch {first} --config FILE`")


def _get(store: RunStore, run_id: str) -> RunRecord:
    """From the history; a run id it lacks is looked for in the bucket's records first (merged there)."""
    try:
        return store.get(run_id)
    except NotFound:
        if bucket_record.merge_into_history(load_settings(), store) is not None:
            raise  # the bucket cannot be read: the history's answer stands
        return store.get(run_id)
