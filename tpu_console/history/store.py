"""Run history in SQLite (`locations.database_file()`): what was launched where, and how it ended.

Holds ids, names, digests, times and exit statuses only: never a config's secrets or `.env` content
(the launcher never hands them over).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.errors import NotFound
from tpu_console.worker.run_record import LaunchRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    provider TEXT NOT NULL,
    accelerator_type TEXT NOT NULL,
    workers TEXT NOT NULL,              -- JSON list of the worker indices launched
    config_path TEXT NOT NULL,
    config_digest TEXT NOT NULL,
    overrides TEXT NOT NULL,            -- JSON list of --set KEY=VALUE
    code_version TEXT,
    python TEXT NOT NULL,
    started_at TEXT NOT NULL,
    state TEXT NOT NULL,
    failure TEXT,
    finished_at TEXT,
    stop_requested_at TEXT
);
CREATE TABLE IF NOT EXISTS run_workers (
    run_id TEXT NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    worker INTEGER NOT NULL,
    pgid INTEGER,
    start_error TEXT,
    state TEXT NOT NULL,
    exit_status INTEGER,
    PRIMARY KEY (run_id, worker)
);
CREATE INDEX IF NOT EXISTS runs_by_node ON runs(node, started_at);
"""
# Columns added after the first release, with their types: added to an older database when it is opened.
_ADDED_COLUMNS = {
    "summary": "TEXT",  # JSON: the final metric summary (runs.summary.RunSummary.to_json)
    "archive_path": "TEXT",  # local folder holding every worker's output.log and events.jsonl
    "price_per_hour": "REAL",  # the node's approximate USD price per hour when launched (spot or on-demand)
    "job": "TEXT",  # JSON: launch.json's `job` object (what ran, where, from which project and setup)
    "launched_by": "TEXT",  # JSON: launch.json's `launched_by` ({user, host, home}; history/ownership.py)
    "slices": "INTEGER",  # the node's slice count (a multislice); NULL in older rows: one slice
}
_ADDED_WORKER_COLUMNS = {
    "exit_time": "REAL",  # when its exit file was written: the order of failures (RunMonitor.first_failure)
}


@dataclass
class WorkerRecord:
    worker: int
    state: str = "pending"
    pgid: int | None = None
    start_error: str | None = None
    exit_status: int | None = None
    exit_time: float | None = None  # when its exit file was written (unix s): which worker failed first


@dataclass
class RunRecord:
    run_id: str
    node: str
    provider: str
    accelerator_type: str
    workers: list[int]
    config_path: str
    config_digest: str
    overrides: list[str]
    python: str
    started_at: datetime
    state: str = "pending"
    code_version: str | None = None
    failure: str | None = None
    finished_at: datetime | None = None
    stop_requested_at: datetime | None = None
    worker_records: dict[int, WorkerRecord] = field(default_factory=dict)
    summary: dict[str, Any] | None = None  # the final metric summary, once the run ended (runs.summary)
    archive_path: str | None = None  # where every worker's log and events were copied when it ended
    price_per_hour: float | None = None  # the node's price when launched; None where unknown (local pods)
    job: dict[str, Any] | None = None  # launch.json's `job` object; None for runs recorded before it existed
    launched_by: dict[str, Any] | None = None  # who launched it, from where; None before it was recorded
    slices: int = 1  # the node's slices (a multislice): its workers are slice by slice

    @classmethod
    def from_launch(cls, launch: LaunchRecord, **seen: Any) -> RunRecord:
        """The history's entry for a run as its launch record has it (worker/run_record.py); `seen`: what
        is known beyond it (its state, its workers' records, its end)."""
        record = cls(
            run_id=launch.run_id,
            node=launch.node,
            provider=launch.provider,
            accelerator_type=launch.accelerator_type,
            workers=list(launch.workers),
            config_path=launch.config_source,
            config_digest=launch.config_digest,
            overrides=list(launch.overrides),
            python=launch.python,
            started_at=launch.started() or datetime.now(UTC),
            code_version=launch.code_text,
            price_per_hour=launch.price_per_hour,
            job=launch.job,
            launched_by=launch.launched_by,
            slices=launch.slices,
        )
        return replace(record, **seen)

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    @property
    def project(self) -> dict[str, Any] | None:
        """project.json of the project a command job ran in (None: the trainer, or no project synced)."""
        project = (self.job or {}).get("project") if (self.job or {}).get("kind") == "command" else None
        return project if isinstance(project, dict) else None

    @property
    def code(self) -> str | None:
        """The code it ran, as an id: a command job's project digest (a job with none: None); the bundled
        trainer's, the console checkout it shipped from (`code_version`)."""
        if (self.job or {}).get("kind") != "command":
            return self.code_version
        return str(self.project["digest"]) if self.project and self.project.get("digest") else None

    def code_text(self) -> str:
        """The code it ran, for a person: `project NAME, digest D (git SHA)` for a command job, the
        console's commit for the bundled trainer."""
        if (self.job or {}).get("kind") != "command":
            return self.code_version or "unknown"
        project = self.project
        if project is None:
            return "- (no project synced: the command ran in its run folder)"
        text = f"project {project.get('name') or project.get('url') or '?'}, digest {str(self.code)[:12]}"
        if project.get("git_sha"):
            text += f" (git {str(project['git_sha'])[:12]}{'+dirty' if project.get('dirty') else ''})"
        return text


class RunStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or locations.database_file()
        with self._connect() as db:
            db.executescript(_SCHEMA)
            # Consoles opening one database at once (the app and a CLI command) upgrade it one at a time:
            # without the write lock both saw a column missing and the second ALTER failed.
            db.execute("BEGIN IMMEDIATE")
            present = {row["name"] for row in db.execute("PRAGMA table_info(runs)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE runs ADD COLUMN {column} {kind}")
            present = {row["name"] for row in db.execute("PRAGMA table_info(run_workers)")}
            for column, kind in _ADDED_WORKER_COLUMNS.items():
                if column not in present:
                    db.execute(f"ALTER TABLE run_workers ADD COLUMN {column} {kind}")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=10)) as db:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys = ON")
            with db:  # one transaction: committed on success, rolled back on error
                yield db

    def add(self, record: RunRecord) -> None:
        with self._connect() as db:
            db.execute(
                "INSERT INTO runs (run_id, node, provider, accelerator_type, workers, config_path, "
                "config_digest,"
                " overrides, code_version, python, started_at, state, failure, finished_at, "
                "stop_requested_at,"
                " price_per_hour, job, launched_by, slices) VALUES (" + ", ".join("?" * 19) + ")",
                (
                    record.run_id,
                    record.node,
                    record.provider,
                    record.accelerator_type,
                    json.dumps(record.workers),
                    record.config_path,
                    record.config_digest,
                    json.dumps(record.overrides),
                    record.code_version,
                    record.python,
                    _iso(record.started_at),
                    record.state,
                    record.failure,
                    _iso(record.finished_at),
                    _iso(record.stop_requested_at),
                    record.price_per_hour,
                    json.dumps(record.job) if record.job is not None else None,
                    json.dumps(record.launched_by) if record.launched_by is not None else None,
                    record.slices,
                ),
            )
            self._put_workers(db, record.run_id, record.worker_records.values())

    def get(self, run_id: str) -> RunRecord:
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise NotFound(
                    f"unknown run id {run_id!r}: `tpu-console runs` lists the runs launched from here"
                )
            return self._record(db, row)

    def list(self, node: str | None = None, limit: int = 50) -> list[RunRecord]:
        """Most recent first."""
        query = (
            "SELECT * FROM runs"
            + (" WHERE node = ?" if node else "")
            + " ORDER BY started_at DESC, run_id DESC LIMIT ?"
        )
        params: tuple = (node, limit) if node else (limit,)
        with self._connect() as db:
            return [self._record(db, row) for row in db.execute(query, params).fetchall()]

    def update(
        self,
        run_id: str,
        state: str,
        workers: Sequence[WorkerRecord] = (),
        failure: str | None = None,
        finished: bool = False,
    ) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE runs SET state = ?, failure = ?, finished_at = COALESCE(finished_at, ?) WHERE "
                "run_id = ?",
                (state, failure, _iso(datetime.now(UTC)) if finished else None, run_id),
            )
            self._put_workers(db, run_id, workers)

    def set_summary(
        self, run_id: str, summary: dict[str, Any] | None = None, archive_path: str | None = None
    ) -> None:
        """Keep the final metric summary and the local archive's folder (each left as is when None)."""
        with self._connect() as db:
            db.execute(
                "UPDATE runs SET summary = COALESCE(?, summary), archive_path = COALESCE(?, archive_path)"
                " WHERE run_id = ?",
                (json.dumps(summary) if summary is not None else None, archive_path, run_id),
            )

    def mark_stop_requested(self, run_id: str) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE runs SET stop_requested_at = COALESCE(stop_requested_at, ?) WHERE run_id = ?",
                (_iso(datetime.now(UTC)), run_id),
            )

    @staticmethod
    def _put_workers(
        db: sqlite3.Connection, run_id: str, workers: Iterator[WorkerRecord] | Sequence[WorkerRecord]
    ) -> None:
        db.executemany(
            "INSERT INTO run_workers (run_id, worker, pgid, start_error, state, exit_status, exit_time)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(run_id, worker) DO UPDATE SET pgid = COALESCE(excluded.pgid, pgid),"
            " start_error = COALESCE(excluded.start_error, start_error), state = excluded.state,"
            " exit_status = excluded.exit_status, exit_time = COALESCE(excluded.exit_time, exit_time)",
            [(run_id, w.worker, w.pgid, w.start_error, w.state, w.exit_status, w.exit_time)
             for w in workers],
        )

    @staticmethod
    def _record(db: sqlite3.Connection, row: sqlite3.Row) -> RunRecord:
        workers = {
            r["worker"]: WorkerRecord(r["worker"], r["state"], r["pgid"], r["start_error"], r["exit_status"],
                                      r["exit_time"])
            for r in db.execute(
                "SELECT * FROM run_workers WHERE run_id = ? ORDER BY worker", (row["run_id"],)
            )
        }
        return RunRecord(
            run_id=row["run_id"],
            node=row["node"],
            provider=row["provider"],
            accelerator_type=row["accelerator_type"],
            workers=json.loads(row["workers"]),
            config_path=row["config_path"],
            config_digest=row["config_digest"],
            overrides=json.loads(row["overrides"]),
            python=row["python"],
            started_at=_parse(row["started_at"]) or datetime.now(UTC),
            state=row["state"],
            code_version=row["code_version"],
            failure=row["failure"],
            finished_at=_parse(row["finished_at"]),
            stop_requested_at=_parse(row["stop_requested_at"]),
            worker_records=workers,
            summary=json.loads(row["summary"]) if row["summary"] else None,
            archive_path=row["archive_path"],
            price_per_hour=row["price_per_hour"],
            job=json.loads(row["job"]) if row["job"] else None,
            launched_by=json.loads(row["launched_by"]) if row["launched_by"] else None,
            slices=row["slices"] or 1,
        )


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None


def _parse(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None
