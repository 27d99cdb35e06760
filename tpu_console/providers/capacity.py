"""A memory of capacity: every create attempt, in the history database (its own table beside the runs),
and what it says about each zone: attempts, successes, the median wait, preemptions per node-hour.

Providers write it (they see each zone's attempt and outcome); `tpu-console capacity` reads it, and
`create --zones auto` orders zones by it. It sits with the providers because they write it, below the
runs layer whose store shares the file.
"""

from __future__ import annotations

import sqlite3
import statistics
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tpu_console import locations

_SCHEMA = """
CREATE TABLE IF NOT EXISTS capacity_attempts (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    provider TEXT NOT NULL,
    project TEXT NOT NULL,
    zone TEXT NOT NULL,
    accelerator_type TEXT NOT NULL,
    provisioning TEXT NOT NULL,          -- spot, on-demand, reservation, best-effort
    method TEXT NOT NULL,                -- queued, direct
    node TEXT NOT NULL,
    started_at TEXT NOT NULL,
    outcome TEXT,                        -- see OUTCOMES; NULL while under way
    reason TEXT,
    active_after_s REAL,                 -- from the request to capacity (ACTIVE, or the node existing)
    ready_after_s REAL,                  -- from the request to a READY node
    preempted_after_s REAL,              -- from READY to first seen PREEMPTED
    ended_at TEXT                        -- deleted (or first seen preempted)
);
CREATE INDEX IF NOT EXISTS capacity_by_type ON capacity_attempts(accelerator_type, zone);
"""

# What an attempt can come to. Only `ready` is a success; `cancelled` and `lost race` say nothing
# about the zone's capacity either way, and are left out of the rates.
READY, CAPACITY, RESERVATION, FAILED, CANCELLED, LOST_RACE = (
    "ready", "no capacity", "reservation not found", "failed", "cancelled", "lost race")
NEUTRAL = (CANCELLED, LOST_RACE)


@dataclass
class Attempt:
    provider: str
    project: str
    zone: str
    accelerator_type: str
    provisioning: str
    method: str
    node: str
    started_at: datetime
    outcome: str | None = None
    reason: str | None = None
    active_after_s: float | None = None
    ready_after_s: float | None = None
    preempted_after_s: float | None = None
    ended_at: datetime | None = None
    id: int | None = None


class CapacityStore:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or locations.database_file()
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=10)) as db:
            db.row_factory = sqlite3.Row
            with db:
                yield db

    def start(self, attempt: Attempt) -> int:
        with self._connect() as db:
            cursor = db.execute(
                "INSERT INTO capacity_attempts (provider, project, zone, accelerator_type, provisioning, "
                "method, node, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (attempt.provider, attempt.project, attempt.zone, attempt.accelerator_type,
                 attempt.provisioning, attempt.method, attempt.node, _iso(attempt.started_at)),
            )
            attempt.id = int(cursor.lastrowid or 0)
            return attempt.id

    def finish(self, attempt_id: int, outcome: str, reason: str | None = None, *,
               active_after_s: float | None = None, ready_after_s: float | None = None) -> None:
        with self._connect() as db:
            db.execute(
                "UPDATE capacity_attempts SET outcome = ?, reason = ?, active_after_s = "
                "COALESCE(?, active_after_s), ready_after_s = ? WHERE id = ?",
                (outcome, reason, active_after_s, ready_after_s, attempt_id),
            )

    def mark_active(self, attempt_id: int, active_after_s: float) -> None:
        with self._connect() as db:
            db.execute("UPDATE capacity_attempts SET active_after_s = ? WHERE id = ?",
                       (active_after_s, attempt_id))

    def mark_preempted(self, project: str, zone: str, node: str, at: datetime) -> bool:
        """The node's latest READY attempt was first seen preempted `at`; False when already known."""
        with self._connect() as db:
            row = self._latest_ready(db, project, zone, node)
            if row is None or row["ended_at"] is not None:
                return False
            ready_at = _parse(row["started_at"]).timestamp() + (row["ready_after_s"] or 0)
            db.execute("UPDATE capacity_attempts SET preempted_after_s = ?, ended_at = ? WHERE id = ?",
                       (max(0.0, at.timestamp() - ready_at), _iso(at), row["id"]))
            return True

    def mark_ended(self, project: str, zone: str, node: str, at: datetime) -> None:
        """The node was deleted: its node-hours stop counting."""
        with self._connect() as db:
            row = self._latest_ready(db, project, zone, node)
            if row is not None and row["ended_at"] is None:
                db.execute("UPDATE capacity_attempts SET ended_at = ? WHERE id = ?", (_iso(at), row["id"]))

    @staticmethod
    def _latest_ready(db: sqlite3.Connection, project: str, zone: str, node: str) -> sqlite3.Row | None:
        return db.execute(
            "SELECT * FROM capacity_attempts WHERE project = ? AND zone = ? AND node = ? AND outcome = ? "
            "ORDER BY id DESC LIMIT 1", (project, zone, node, READY)).fetchone()

    def attempts(self, accelerator_type: str | None = None, project: str | None = None) -> list[Attempt]:
        query, params = "SELECT * FROM capacity_attempts WHERE 1 = 1", []
        if accelerator_type:
            query, params = query + " AND accelerator_type = ?", [*params, accelerator_type]
        if project:
            query, params = query + " AND project = ?", [*params, project]
        with self._connect() as db:
            rows = db.execute(query + " ORDER BY id", params).fetchall()
        return [
            Attempt(
                provider=row["provider"], project=row["project"], zone=row["zone"],
                accelerator_type=row["accelerator_type"], provisioning=row["provisioning"],
                method=row["method"], node=row["node"], started_at=_parse(row["started_at"]),
                outcome=row["outcome"], reason=row["reason"], active_after_s=row["active_after_s"],
                ready_after_s=row["ready_after_s"], preempted_after_s=row["preempted_after_s"],
                ended_at=_parse(row["ended_at"]) if row["ended_at"] else None, id=row["id"],
            )
            for row in rows
        ]


@dataclass(frozen=True)
class ZoneRecord:
    """What the record says about one zone for one type."""

    zone: str
    accelerator_type: str
    attempts: int  # those that say something about capacity (not cancelled, not lost races)
    successes: int
    median_wait_s: float | None  # request to READY, over the successes
    preemptions: int
    spot_node_hours: float  # READY spot nodes' hours, until preempted, deleted, or now

    @property
    def success_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0

    @property
    def preemptions_per_node_hour(self) -> float | None:
        return self.preemptions / self.spot_node_hours if self.spot_node_hours > 0 else None


def summarize(attempts: Iterable[Attempt], now: datetime) -> list[ZoneRecord]:
    """Per zone and type, in zone then type order. Pure: the caller reads the store."""
    groups: dict[tuple[str, str], list[Attempt]] = {}
    for attempt in attempts:
        groups.setdefault((attempt.zone, attempt.accelerator_type), []).append(attempt)
    records = []
    for (zone, accelerator_type), group in sorted(groups.items()):
        counted = [a for a in group if a.outcome is not None and a.outcome not in NEUTRAL]
        ready = [a for a in counted if a.outcome == READY]
        waits = [a.ready_after_s for a in ready if a.ready_after_s is not None]
        spot = [a for a in ready if a.provisioning == "spot"]
        hours = sum(_node_hours(a, now) for a in spot)
        records.append(ZoneRecord(
            zone=zone, accelerator_type=accelerator_type, attempts=len(counted), successes=len(ready),
            median_wait_s=statistics.median(waits) if waits else None,
            preemptions=sum(1 for a in spot if a.preempted_after_s is not None), spot_node_hours=hours,
        ))
    return records


def order_zones(configured: Sequence[str], records: Iterable[ZoneRecord], accelerator_type: str) -> list[str]:
    """`--zones auto`: proven zones first (best success rate, then shortest median wait), then configured
    zones not yet tried (in their configured order), then zones tried without success (fewest tries first)."""
    mine = {r.zone: r for r in records if r.accelerator_type == accelerator_type and r.attempts}
    proven = sorted((r for r in mine.values() if r.successes),
                    key=lambda r: (-r.success_rate, r.median_wait_s or 0.0, r.zone))
    untried = [z for z in configured if z not in mine]
    unlucky = sorted((r for r in mine.values() if not r.successes and r.zone in configured),
                     key=lambda r: (r.attempts, r.zone))
    return [r.zone for r in proven] + untried + [r.zone for r in unlucky]


def _node_hours(attempt: Attempt, now: datetime) -> float:
    ready_at = attempt.started_at.timestamp() + (attempt.ready_after_s or 0.0)
    if attempt.preempted_after_s is not None:
        return attempt.preempted_after_s / 3600
    end = (attempt.ended_at or now).timestamp()
    return max(0.0, end - ready_at) / 3600


def _iso(moment: datetime) -> str:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def _parse(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
