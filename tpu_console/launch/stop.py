"""Stopping a run: SIGTERM its job's process group on every worker, SIGKILL after a grace period, and free
the node's launch lock for the next launch once every worker has ended, wherever the run holds it (worker 0,
or on a multislice the first host of another slice: launch/lock.py's `lock_places`)."""

from __future__ import annotations

from dataclasses import dataclass

from tpu_console.errors import UserError
from tpu_console.fleet import run_recipes
from tpu_console.history.run_id import check_run_id
from tpu_console.history.store import RunStore
from tpu_console.launch import lock as launch_lock
from tpu_console.observe.lookup import STATUS_EVENTS_TAIL_BYTES, RunView, last_line, probe_records, save_view
from tpu_console.observe.reach import reach_node
from tpu_console.providers.base import Provider


@dataclass
class WorkerStop:
    worker: int
    outcome: str  # stopped, exited, gone, not-started, missing, unreachable
    signal: str | None = None  # TERM or KILL: what ended it
    exit_status: int | None = None
    error: str | None = None


async def stop(
    providers: dict[str, Provider], run_id: str, store: RunStore | None = None, grace_s: float = 10.0
) -> tuple[RunView, list[WorkerStop]]:
    """SIGTERM the job's process group on every worker, SIGKILL after `grace_s`; the run as it ends up."""
    store = store or RunStore()
    record = store.get(check_run_id(run_id))
    async with reach_node(providers, record.node) as reach:
        if reach.fleet is None:
            raise UserError(f"cannot stop {run_id}: {reach.problem}")
        store.mark_stop_requested(record.run_id)
        record = store.get(record.run_id)
        workers = [w for w in record.workers if w in reach.fleet.targets]
        results = await reach.fleet.run(
            run_recipes.stop_run(record.run_id, grace_s), workers, timeout=grace_s + 30
        )
        stops = [
            _stop_outcome(r.worker, r.stdout, r.error or (None if r.ok else last_line(r.stderr, "failed")))
            for r in results
        ]
        (view,) = await probe_records(reach, [record], STATUS_EVENTS_TAIL_BYTES, 3)
        save_view(store, view)
        places = launch_lock.lock_places(reach.node) if reach.node else (launch_lock.LOCK_WORKER,)
        held_at = [w for w in places if w in reach.fleet.targets]  # released only where it names this run
        if all(s.done for s in view.workers) and held_at:  # free for the next
            await reach.fleet.run(launch_lock.release_recipe(run_id=record.run_id), held_at, timeout=30)
    return view, stops


def _stop_outcome(worker: int, stdout: str, error: str | None) -> WorkerStop:
    if error is not None:
        return WorkerStop(worker, "unreachable", error=error)
    values = dict(word.partition("=")[::2] for word in stdout.split())
    exit_text = values.get("exit", "")
    return WorkerStop(
        worker,
        values.get("state", "unknown"),
        signal=values.get("signal") or None,
        exit_status=int(exit_text) if exit_text.isdigit() else None,
    )
