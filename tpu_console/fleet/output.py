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
    def __init__(self, worker: int, on_line: OnLine | None, streamed: bool = False) -> None:
        """`streamed`: a long-lived command whose stdout goes to `on_line` only, in whole lines: none of it
        is kept (a follow may run for days), and a last line cut off without its newline is dropped (it is
        a record cut short by a dropped connection). stderr is always kept: it says why a command failed."""
        self._worker = worker
        self._on_line = on_line
        self._streamed = streamed
        self.stdout = bytearray()
        self.stderr = bytearray()
        self._partial = {"stdout": bytearray(), "stderr": bytearray()}

    def add(self, stream: str, data: bytes) -> None:
        """`stream` is "stdout" or "stderr"."""
        if stream == "stderr":
            self.stderr.extend(data)
        elif not self._streamed:
            self.stdout.extend(data)
        if self._on_line is None:
            return
        partial = self._partial[stream]
        cut = data.rfind(b"\n")
        if cut < 0:  # a long line arriving in many pieces is joined once, when it is complete
            partial.extend(data)
            return
        partial.extend(data[:cut])
        lines = partial.split(b"\n")
        partial.clear()
        partial.extend(data[cut + 1 :])
        for line in lines:
            self._emit(stream, line)

    def end(self) -> None:
        """No more output: a last line without a newline is streamed too."""
        if self._on_line is not None:
            for stream, rest in self._partial.items():
                if rest and not (self._streamed and stream == "stdout"):
                    self._emit(stream, bytes(rest))
                    rest.clear()

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

    def _emit(self, stream: str, line: bytes | bytearray) -> None:
        assert self._on_line is not None
        self._on_line(WorkerLine(self._worker, stream, line.decode("utf-8", errors="replace")))
