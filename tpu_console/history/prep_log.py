"""When each node was created, bootstrapped, synced and set up, in the console's SQLite store
(`locations.database_file()`, table `node_prep`): the time before a run that its goodput counts
(history/goodput.py). Written by whatever did the work (the CLI's verbs, the app's nodes screen); a failure to
write it never fails the work itself.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypeVar

from tpu_console import locations
from tpu_console.history.goodput import PREP_CATEGORY, Span

T = TypeVar("T")
KINDS = tuple(PREP_CATEGORY)  # create, bootstrap, sync, setup

_SCHEMA = """
CREATE TABLE IF NOT EXISTS node_prep (
    node TEXT NOT NULL,
    kind TEXT NOT NULL,                 -- create, bootstrap, sync, setup
    started_at REAL NOT NULL,           -- unix seconds
    finished_at REAL NOT NULL,
    ok INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS node_prep_by_node ON node_prep(node, started_at);
"""


class PrepLog:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or locations.database_file()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=10)) as db, db:
            yield db

    def add(self, node: str, kind: str, started_at: float, finished_at: float, ok: bool) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown preparation {kind!r}; one of {', '.join(KINDS)}")
        with self._connect() as db:
            db.execute("INSERT INTO node_prep VALUES (?, ?, ?, ?, ?)",
                       (node, kind, started_at, finished_at, int(ok)))

    def spans(self, node: str, since: float | None = None, until: float | None = None) -> list[Span]:
        """What was done on `node` that started in [since, until), oldest first: failed bootstraps, syncs and
        setups too (the node was there, their time spent all the same), creates only when they made it."""
        query = ("SELECT kind, started_at, finished_at FROM node_prep WHERE node = ?"
                 " AND (ok = 1 OR kind != 'create')")
        params: list[object] = [node]
        if since is not None:
            query += " AND started_at >= ?"
            params.append(since)
        if until is not None:
            query += " AND started_at < ?"
            params.append(until)
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY started_at", params).fetchall()
        return [Span(kind, start, end) for kind, start, end in rows]


def record(node: str, kind: str, started_at: float, ok: bool, path: Path | None = None) -> None:
    """Keep one piece of preparation that ended now. Never raises: goodput is a view, the work is done."""
    try:
        PrepLog(path).add(node, kind, started_at, time.time(), ok)
    except (sqlite3.Error, OSError, ValueError):
        pass


async def timed(node: str | None, kind: str, work: Awaitable[T],
                ok: Callable[[T], bool] = lambda _: True) -> T:
    """Await the work done on `node` and keep when it ran; it went well when it returns what `ok` accepts
    (the CLI: exit status 0) without raising."""
    started, went_well = time.time(), False
    try:
        result = await work
        went_well = ok(result)
        return result
    finally:
        if node:
            record(node, kind, started, went_well)
