"""A local copy of a finished run: every worker's `output.log` and `events.jsonl`, so the history keeps a
run's evidence after its node is deleted (a spot VM may be gone an hour later).

    $TPU_CONSOLE_HOME/archive/<run_id>/worker-<i>/output.log
    $TPU_CONSOLE_HOME/archive/<run_id>/worker-<i>/events.jsonl

The files travel through the same byte-offset reads as `logs` (fleet/run_recipes.py `tail_log`), a chunk at a
time, so a large log never sits in memory whole, and every line is masked (tpu_console/secrets.py) before
it is written: a value from `.env` that a job printed is stored as `***`.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tpu_console import locations
from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.history.events import Event, EventSummary, StepMetrics, parse_event_line
from tpu_console.history.tail import TailCursor, parse_chunk
from tpu_console.secrets import SecretMasker

# supervisor.jsonl: what the run's supervisor decided (on its worker only; empty elsewhere)
ARCHIVED_FILES = ("output.log", "events.jsonl", "supervisor.jsonl")
CHUNK_BYTES = 4 << 20


def archive_dir(run_id: str) -> Path:
    return locations.home() / "archive" / run_id


@dataclass
class ArchiveResult:
    path: Path
    bytes_by_worker: dict[int, int] = field(default_factory=dict)
    problems: dict[int, str] = field(default_factory=dict)  # workers whose files could not be copied

    @property
    def complete(self) -> bool:
        return not self.problems


async def archive_run(
    fleet: Fleet,
    run_id: str,
    workers: Sequence[int],
    masker: SecretMasker | None = None,
    dest: Path | None = None,
) -> ArchiveResult:
    """Copy every worker's log and events into `dest` (default `archive_dir(run_id)`), masked."""
    result = ArchiveResult(dest or archive_dir(run_id))
    masker = masker or SecretMasker()

    async def one(worker: int) -> None:
        folder = result.path / f"worker-{worker}"
        folder.mkdir(parents=True, exist_ok=True)
        _remove_stale_parts(folder)
        total = 0
        for name in ARCHIVED_FILES:
            copied = await _copy(fleet, run_id, worker, name, folder / name, masker)
            if isinstance(copied, str):
                result.problems[worker] = f"{name}: {copied}"
                return
            total += copied
        result.bytes_by_worker[worker] = total

    await asyncio.gather(*(one(w) for w in workers))
    return result


def _remove_stale_parts(folder: Path) -> None:
    """What copies killed half-way left (kill -9, a laptop's lid): each copy's temporary file is named with
    its process id (`.output.log.<pid>.<random>.part`), and one whose process is gone is removed; a live
    copy's, in this process or another, is left to finish."""
    for part in folder.glob(".*.part"):
        pid = part.name.split(".")[-3]
        if pid.isdigit() and not _alive(int(pid)):
            part.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


async def _copy(
    fleet: Fleet, run_id: str, worker: int, name: str, local: Path, masker: SecretMasker
) -> int | str:
    """The number of bytes read from the worker, or why the copy failed."""
    cursor = TailCursor(max_bytes=CHUNK_BYTES)
    # A temporary file of this copy's own: two copies of one run at once (the app and `status` in another
    # terminal) each write theirs, and the last to finish replaces the other's with the same bytes.
    descriptor, tmp_name = tempfile.mkstemp(prefix=f".{local.name}.{os.getpid()}.", suffix=".part",
                                            dir=local.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            while True:
                command = run_recipes.tail_log(run_id, offset=cursor.offset, max_bytes=CHUNK_BYTES, file=name)
                (answer,) = await fleet.run(command, [worker], timeout=120)
                chunk = parse_chunk(answer.stdout) if answer.ok else None
                if chunk is None:
                    return answer.error or answer.stderr.strip() or "read failed"
                at_end = chunk.end >= chunk.size
                lines = cursor.take(chunk, final=at_end)
                if lines:
                    out.write("\n".join(masker.mask(line) for line in lines) + "\n")
                if at_end:
                    break
        tmp.chmod(0o644)  # as a plain write would leave it (mkstemp's is 0600)
        tmp.replace(local)
    finally:
        tmp.unlink(missing_ok=True)
    return cursor.offset


def archived_start_in(folder: Path, workers: list[int]) -> Event | None:
    """The first `start` event in an archive folder, the workers' files read in order (None: none there)."""
    for worker in workers:
        path = folder / f"worker-{worker}" / "events.jsonl"
        if path.exists():
            with path.open(encoding="utf-8") as lines:
                for line in lines:
                    event = parse_event_line(line)
                    if event is not None and event.kind == "start":
                        return event
    return None


def archived_events_in(folder: Path, workers: list[int]) -> dict[int, EventSummary]:
    """What each worker's events say (last step, start, error, end), from an archive folder's
    `worker-N/events.jsonl` (empty where there is none)."""
    summaries: dict[int, EventSummary] = {}
    for worker in workers:
        summary = summaries[worker] = EventSummary()
        path = folder / f"worker-{worker}" / "events.jsonl"
        if path.exists():
            with path.open(encoding="utf-8") as lines:
                summary.add(e for line in lines if (e := parse_event_line(line)) is not None)
    return summaries


def archived_last_steps_in(folder: Path, workers: list[int]) -> dict[int, StepMetrics | None]:
    """Each worker's last step from an archive folder's `worker-N/events.jsonl` (None: no step there)."""
    return {worker: summary.last_step for worker, summary in archived_events_in(folder, workers).items()}
