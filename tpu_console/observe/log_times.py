"""When each line of a worker's output.log was written, from the job runner's `output.times`
(worker/job_runner.py, LogTimes): a line `<size> <unix time>` each time the log had grown, every half
second. A line was written by the time of the first mark whose size reaches its end. Pure: no I/O; the
watch feeds it the times file's lines as they stream in.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

TIMES = "output.times"
MOST_MARKS = 8192  # the latest marks kept: the lines still to be placed are the latest ones


class LogTimes:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.times: list[float] = []

    def add(self, lines: Iterable[str]) -> None:
        for line in lines:
            size, _, moment = line.partition(" ")
            try:
                size_bytes, at = int(size), float(moment)
            except ValueError:
                continue  # a line cut short or not ours
            if self.sizes and size_bytes <= self.sizes[-1]:
                continue  # the log was written again from the start: those marks are a new log's
            self.sizes.append(size_bytes)
            self.times.append(at)
        if len(self.sizes) > MOST_MARKS:
            del self.sizes[:-MOST_MARKS], self.times[:-MOST_MARKS]

    def time_of(self, end: int) -> float | None:
        """When the bytes up to offset `end` had all been written; None when no mark reaches it yet (the
        line is newer than the last mark)."""
        at = bisect.bisect_left(self.sizes, end)
        return self.times[at] if at < len(self.sizes) else None


def line_times(times: LogTimes, end: int, lines: Sequence[str]) -> tuple[float | None, ...]:
    """When each of `lines` was written (`time_of` of its end), the last ending at `end`. Lines newer
    than the last mark (all of them, on a log followed closely, or from a job that writes no times) are
    told by one encoding of the whole chunk, not a look per line."""
    if not times.sizes:
        return (None,) * len(lines)
    first_start = end - len("\n".join(lines).encode("utf-8", errors="replace")) - 1
    if times.sizes[-1] <= first_start:
        return (None,) * len(lines)  # every line ends past the last mark
    return tuple(times.time_of(at) for at in line_ends(end, lines))


def line_ends(end: int, lines: Sequence[str]) -> list[int]:
    """The byte offset just past each of `lines` (each followed by its newline), the last ending at `end`."""
    ends = []
    for line in reversed(lines):
        ends.append(end)
        end -= len(line.encode("utf-8", errors="replace")) + 1
    return ends[::-1]
