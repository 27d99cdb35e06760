"""A command's output as it arrives (kept whole per stream, and split into lines for streaming), and
what a finished command hands back. Shared by the exec path (command.py) and the command channel
(command_channel.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpu_console.fleet.results import WorkerLine

OnLine = Callable[[WorkerLine], None]


@dataclass
class CommandOutcome:
    exit_status: int | None
    stdout: bytes
    stderr: bytes
    error: str | None  # "timed out after 2s", "connection lost: ...", or None when the command finished


class CommandOutput:
    def __init__(self, worker: int, on_line: OnLine | None) -> None:
        self._worker = worker
        self._on_line = on_line
        self.stdout = bytearray()
        self.stderr = bytearray()
        self._partial = {"stdout": b"", "stderr": b""}

    def add(self, stream: str, data: bytes) -> None:
        """`stream` is "stdout" or "stderr"."""
        (self.stderr if stream == "stderr" else self.stdout).extend(data)
        if self._on_line is not None:
            *lines, self._partial[stream] = (self._partial[stream] + data).split(b"\n")
            for line in lines:
                self._emit(stream, line)

    def end(self) -> None:
        """No more output: a last line without a newline is streamed too."""
        if self._on_line is not None:
            for stream, rest in self._partial.items():
                if rest:
                    self._emit(stream, rest)
            self._partial = {"stdout": b"", "stderr": b""}

    def outcome(
        self, exit_status: int | None, exc: BaseException | None, timeout: float | None
    ) -> CommandOutcome:
        """The finished command: its status and output, or why it has no status (`exc` is TimeoutError
        when it ran past `timeout`, else why its session or channel went away)."""
        if isinstance(exc, TimeoutError):
            error: str | None = f"timed out after {timeout:g}s"
        elif exc is not None:
            error = f"connection lost while running: {getattr(exc, 'reason', None) or exc}"
        elif exit_status is None:
            error = "closed without an exit status"
        else:
            error = None
        return CommandOutcome(None if error else exit_status, bytes(self.stdout), bytes(self.stderr), error)

    def _emit(self, stream: str, line: bytes) -> None:
        assert self._on_line is not None
        self._on_line(WorkerLine(self._worker, stream, line.decode("utf-8", errors="replace")))
