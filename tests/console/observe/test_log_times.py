"""When each log line was written, from the job runner's marks (observe/log_times.py), and the workers' lines
merged by it (tui/run_feed.py, in_time_order)."""

from __future__ import annotations

from tpu_console.observe.log_times import LogTimes, line_ends, line_times
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
    merged = [(0, "a0"), (1, "b0"), (1, "b1"), (0, "a1"), (0, "a2"), (1, "b2")]
    assert in_time_order([(w, [text], t) for w, text, t in lines]) == merged
    # the same lines in chunks: each line with its own time, or one time for a chunk
    assert in_time_order([(1, ["b0", "b1"], (10.0, 11.0)), (1, ["b2"], 12.0),
                          (0, ["a0", "a1", "a2"], (10.0, 11.5, 9.0))]) == merged
    assert in_time_order([(1, ["b0", "b1"], 10.0), (0, ["a0", "a1"], 10.0), (0, ["a2"], 9.5),
                          (1, ["b2", "b3"], (10.0, 9.0))]) == [
        (0, "a0"), (0, "a1"), (0, "a2"), (1, "b0"), (1, "b1"), (1, "b2"), (1, "b3")]


def test_a_chunks_times_are_each_lines_time_of_its_end():
    """`line_times` (one encoding of the chunk when every line is newer than the last mark) gives what
    `time_of` gives line by line: with no mark, marks before the chunk, inside it, and past it."""
    lines = ["step 1", "é", "", "step 3 | é"]
    end = 100 + sum(len(line.encode()) + 1 for line in lines)
    for marks in ([], ["50 1.0"], ["99 1.0"], ["100 1.0"], ["101 1.0"], ["50 1.0", "108 2.0"],
                  [f"{end} 3.0"], [f"{end + 5} 3.0"]):
        times = LogTimes()
        times.add(marks)
        each = tuple(times.time_of(at) for at in line_ends(end, lines))
        assert line_times(times, end, lines) == each, marks
    assert line_times(LogTimes(), 10, []) == ()


def test_chunks_in_time_order_merge_as_line_by_line():
    """Whether each worker's times rise (one sort) or not (a merge per worker): the lines come as a merge
    of every worker's lines, one by one, by (time, worker) would give them."""
    import heapq
    import random

    rng = random.Random(3)
    for rising in (True, False):
        chunks, clock = [], {w: 0.0 for w in range(5)}
        for n in range(200):
            worker = rng.randrange(5)
            clock[worker] += rng.choice([0.0, 0.5, 1.0]) if rising else rng.choice([-1.0, 0.0, 1.0])
            lines = [f"{worker}.{n}.{i}" for i in range(rng.randrange(1, 4))]
            if rng.random() < 0.5:
                chunks.append((worker, lines, clock[worker]))
            else:
                chunks.append((worker, lines, tuple(clock[worker] + i * rng.choice([0.0, 0.25])
                                                    for i in range(len(lines)))))
                clock[worker] = chunks[-1][2][-1]
        each: dict[int, list[tuple[float, int, str]]] = {}
        for worker, lines, written in chunks:
            times = written if isinstance(written, tuple) else (written,) * len(lines)
            line_by_line = ((t, worker, line) for t, line in zip(times, lines, strict=True))
            each.setdefault(worker, []).extend(line_by_line)
        expected = [(w, line) for _, w, line in heapq.merge(*each.values(), key=lambda e: (e[0], e[1]))]
        assert in_time_order(chunks) == expected
