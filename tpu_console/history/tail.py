"""Resumable log tails: a byte offset per worker, and whole lines only, however the reads fall.

The `tail_log` recipe and the run follower (worker/run_follower.py) send the bytes base64-encoded with the
offsets around them, so the console knows exactly where to resume (after a reconnect, or in a later
console) and never splits a UTF-8 character.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass


@dataclass(frozen=True)
class LogChunk:
    end: int  # byte offset just past `data` in the file
    size: int  # the file's size when it was read
    data: bytes

    @property
    def start(self) -> int:
        return self.end - len(self.data)


def parse_chunk(stdout: str) -> LogChunk | None:
    """The `tail_log` recipe's output, or None if it is not that (the command failed)."""
    head, _, encoded = stdout.partition("\n")
    values = dict(word.partition("=")[::2] for word in head.split())
    try:
        end, size = int(values["end"]), int(values["size"])
        data = base64.b64decode(encoded.strip(), validate=True)
    except (KeyError, ValueError, binascii.Error):
        return None
    return LogChunk(end=end, size=size, data=data)


def parse_chunk_record(fields: str) -> tuple[str, LogChunk] | None:
    """The run follower's `C <file> <start> <end> <size> <base64>` record (without the `C `), or None when
    it is not whole (a connection dropped in the middle of it)."""
    try:
        name, start, end, size, encoded = fields.split(" ")
        chunk = LogChunk(end=int(end), size=int(size), data=base64.b64decode(encoded, validate=True))
    except (ValueError, binascii.Error):
        return None
    return (name, chunk) if chunk.start == int(start) else None


@dataclass
class TailCursor:
    """Where one worker's log has been read up to. `take` returns the complete lines of a chunk and moves
    the offset past them. A cut-off last line is kept in `pending` (unless `final`: the job ended): a
    chunk that follows on from it completes it, a chunk read again from `offset` replaces it."""

    offset: int = 0
    max_bytes: int = 1 << 20
    pending: bytes = b""

    def take(self, chunk: LogChunk, final: bool = False) -> list[str]:
        data, start = chunk.data, chunk.start
        if self.pending and start == self.offset + len(self.pending):
            data, start = self.pending + data, self.offset
        self.pending = b""
        if not final and not data.endswith(b"\n"):
            cut = data.rfind(b"\n")
            # A line longer than a whole read is let through rather than waited on forever.
            if cut >= 0 or len(data) < self.max_bytes:
                data, self.pending = data[: cut + 1], data[cut + 1 :]
        self.offset = start + len(data)
        if not data:
            return []
        text = data.decode("utf-8", errors="replace")
        return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")

    def finish(self) -> list[str]:
        """The file is complete (its job ended): a cut-off last line held in `pending` is a line too."""
        return self.take(LogChunk(end=self.offset + len(self.pending), size=0, data=b""), final=True)
