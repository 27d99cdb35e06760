"""When each log line was written, from the job runner's marks (observe/log_times.py), and the workers' lines
merged by it (tui/run_feed.py, in_time_order)."""

from __future__ import annotations

from tpu_console.observe.log_times import LogTimes, line_ends
from tpu_console.tui.run_feed import in_time_order


def test_a_line_was_written_by_the_first_mark_that_reaches_its_end():
    lines = ["step 1", "step 2", "x", "step 3 | é"]
    ends = line_ends(28, lines)
    assert ends == [7, 14, 16, 28]  # in bytes, with each newline: é is two
    times = LogTimes()
    # the runner's marks: 7 bytes by 100.0, 16 by 100.5; one that did not grow and a cut line are no marks
    times.add(["7 100.0", "16 100.5", "garbage", "16 101.0", "28 101.5"])
    assert [times.time_of(end) for end in ends] == [100.0, 100.5, 100.5, 101.5]
    assert times.time_of(29) is None  # newer than the last mark


def test_workers_lines_merge_by_time_and_ties_by_worker_but_a_workers_own_order_stays():
    lines = [
        (1, "b0", 10.0), (1, "b1", 11.0), (1, "b2", 12.0),
        (0, "a0", 10.0), (0, "a1", 11.5), (0, "a2", 9.0),  # a2 out of order (a clock set back): stays last
    ]
    assert in_time_order(lines) == [(0, "a0"), (1, "b0"), (1, "b1"), (0, "a1"), (0, "a2"), (1, "b2")]
