"""What the history keeps once a run has ended: a local archive of every worker's log and events, and the
final metric summary read from those archived events (so it is complete even when the watcher that saw the
run end had only read the end of each file)."""

from __future__ import annotations

import asyncio
import weakref

from tpu_console.fleet.fleet import Fleet
from tpu_console.history.archive import archive_run, archived_last_steps_in
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.history.summary import summarize
from tpu_console.observe.foreign_metrics import complete_summary, read_foreign
from tpu_console.observe.monitor import RunMonitor
from tpu_console.secrets import SecretMasker

# per event loop and run id: one archive of a run at a time in this process (a lock belongs to one loop)
_ARCHIVING: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


async def keep_run_end(
    fleet: Fleet, record: RunRecord, store: RunStore, monitor: RunMonitor | None = None,
    masker: SecretMasker | None = None,
) -> None:
    """Archive the run's files and store its summary, once (a run already archived is left alone). Two
    callers in one process at once (the dashboard's watch and its one-shot look, both seeing the end) take
    turns: the second finds the run archived."""
    locks = _ARCHIVING.setdefault(asyncio.get_running_loop(), {})
    lock = locks.setdefault(record.run_id, asyncio.Lock())
    async with lock:
        record = store.get(record.run_id)  # as the first caller left it
        if record.archive_path is None:
            await _keep(fleet, record, store, monitor, masker)


async def _keep(
    fleet: Fleet, record: RunRecord, store: RunStore, monitor: RunMonitor | None, masker: SecretMasker | None
) -> None:
    result = await archive_run(
        fleet, record.run_id, record.workers, masker or SecretMasker.for_node(record.node)
    )
    last_steps = await asyncio.to_thread(archived_last_steps_in, result.path, record.workers)
    if monitor is not None:  # workers whose files could not be copied: what was seen live
        for worker in result.problems:
            last_steps[worker] = monitor.workers[worker].events.last_step
    # a command job's W&B summaries fill what its step lines did not say (observe/foreign_metrics.py)
    wandb = await read_foreign(fleet, record, tensorboard=False)
    store.set_summary(record.run_id, complete_summary(summarize(last_steps), wandb), str(result.path))
