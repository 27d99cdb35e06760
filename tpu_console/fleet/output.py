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

    def _emit(self, stream: str, line: bytes) -> None:
        assert self._on_line is not None
        self._on_line(WorkerLine(self._worker, stream, line.decode("utf-8", errors="replace")))
