"""What the fleet hands back: one result per worker, and output lines tagged by worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class WorkerResult:
    worker: int
    exit_status: int | None  # None when the command never ran or did not finish (unreachable, timeout)
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None  # one line, e.g. "unreachable: connection refused (...)", "timed out after 30s"

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and self.error is None


@dataclass(frozen=True)
class WorkerLine:
    worker: int
    stream: str  # "stdout" or "stderr"
    text: str  # one line, no trailing newline
