"""The largest-batch search on its own: for every memory limit, doubling then bisecting over the values the
pod accepts finds the exact boundary, in few trials."""

from __future__ import annotations

import math

import pytest

from tpu_console.experiments.batch_sweep import next_value


def search(candidates: list[int], start: int, fits) -> tuple[dict[int, str], int | None, int | None]:
    outcomes: dict[int, str] = {}
    while (value := next_value(candidates, outcomes, start)) is not None and value not in outcomes:
        outcomes[value] = "fits" if fits(value) else "oom"
    ok = [v for v, o in outcomes.items() if o == "fits"]
    bad = [v for v, o in outcomes.items() if o == "oom"]
    return outcomes, max(ok) if ok else None, min(bad) if bad else None


@pytest.mark.parametrize("start", [1, 4, 16, 64])
def test_the_search_finds_the_exact_boundary_for_every_cap(start):
    candidates = list(range(2, 257, 2))  # e.g. batch sizes that divide over 2 processes
    for cap in range(260):
        outcomes, largest, first_bad = search(candidates, start if start in candidates else 2, cap.__ge__)
        fitting = [c for c in candidates if c <= cap]
        assert largest == (max(fitting) if fitting else None), cap
        if largest is None or largest < candidates[-1]:
            assert first_bad == min(c for c in candidates if c > cap), cap
        assert len(outcomes) <= 2 * math.ceil(math.log2(len(candidates))) + 2, (cap, outcomes)


def test_a_first_trial_that_does_not_fit_walks_down():
    outcomes, largest, first_bad = search([1, 2, 3, 4, 5, 6, 7, 8], 4, lambda v: v <= 2)
    assert (largest, first_bad) == (2, 3) and list(outcomes)[:2] == [4, 2]
