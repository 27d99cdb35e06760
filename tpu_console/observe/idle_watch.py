"""`tpu-console idle`'s loop: read the nodes and the run history (unfinished runs probed now), judge which
nodes are idle (observe/idle_nodes.py, pure), report them, delete those the caller approves, and with a period
look again until interrupted: the guard to leave running overnight."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from tpu_console.observe import lookup
from tpu_console.observe.idle_nodes import IdleNode, find_idle
from tpu_console.providers.base import Progress, Provider, no_progress
from tpu_console.providers.nodes import delete_node, list_nodes


async def idle_nodes(
    providers: dict[str, Provider], idle_after: timedelta
) -> tuple[datetime, list[IdleNode]]:
    """The idle nodes now, and the moment they were judged at."""
    listing = await list_nodes(providers)
    runs = await lookup.list_runs(providers, limit=500)  # unfinished runs are probed now
    now = datetime.now(UTC)
    return now, find_idle(listing.nodes, [v.record for v in runs], now, idle_after)


async def watch_idle(
    providers: dict[str, Provider],
    idle_after: timedelta,
    report: Callable[[datetime, list[IdleNode]], None],
    *,
    delete: Callable[[IdleNode], bool] | None = None,
    every_s: float | None = None,
    progress: Progress = no_progress,
) -> None:
    """Report the idle nodes; delete each one `delete` approves (none without it); with `every_s`, again
    every so many seconds, forever."""
    while True:
        now, idle = await idle_nodes(providers, idle_after)
        report(now, idle)
        for item in idle if delete is not None else []:
            if not delete(item):
                continue
            await delete_node(providers, item.node.name, progress=progress)
            progress(f"deleted {item.describe()}")
        if every_s is None:
            return
        await asyncio.sleep(every_s)
