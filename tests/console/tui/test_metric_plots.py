"""The plots' step axis: whole-number ticks at a round stride, and what a plot with too few steps says."""

from __future__ import annotations

import pytest

from tpu_console.tui.widgets.metric_plots import integer_ticks, too_few_text


@pytest.mark.parametrize(
    ("first", "last", "ticks"),
    [
        (1, 2, [1, 2]),
        (1, 4, [1, 2, 3, 4]),
        (1, 6, [2, 4, 6]),
        (0, 9, [0, 2, 4, 6, 8]),
        (1, 100, [20, 40, 60, 80, 100]),
        (1, 11, [5, 10]),
        (7, 7, [7]),
        (1, 240, [50, 100, 150, 200]),
    ],
)
def test_ticks_are_whole_steps_at_a_round_stride(first, last, ticks):
    found = integer_ticks(list(range(first, last + 1)))
    assert found == ticks
    assert len({b - a for a, b in zip(found, found[1:], strict=False)}) <= 1  # evenly spaced


def test_a_plot_with_no_step_or_one_says_so():
    assert too_few_text("loss", []) == "loss\n\nno steps yet"
    assert too_few_text("loss", [("worker 0", ([], []))]) == "loss\n\nno steps yet"
    assert too_few_text("loss", [("worker 0", ([3], [0.25]))]) == (
        "loss\n\none step so far: 0.25 at step 3\n(a line needs two)")


def test_a_plot_without_its_number_says_why():
    # steps arrived but carry no such number (MaxText reports no reward), or none came (the job's note)
    assert too_few_text("mean reward", [("", ([], []))], steps_seen=True) == (
        "mean reward\n\nthe steps so far do not report it")
    note = "steps: no line of the output matched (auto: seeds, maxtext, jsonl) yet"
    assert too_few_text("step time (s)", [("median", ([], []))], note=note) == f"step time (s)\n\n{note}"
