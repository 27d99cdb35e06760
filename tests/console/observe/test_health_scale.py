"""The health's per-worker work at pod scale: the median of the other workers' step times, from one sort."""

from __future__ import annotations

import random
import statistics

from tpu_console.observe.health import medians_of_the_others


def test_medians_of_the_others_match_the_median_of_the_rest():
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(2, 11)
        values = {w: rng.choice([1.0, 2.0, 2.0, 3.5, rng.uniform(0, 5)]) for w in range(n)}
        got = medians_of_the_others(values)
        for worker in values:
            assert got[worker] == statistics.median(v for w, v in values.items() if w != worker)


def test_one_worker_has_no_others():
    assert medians_of_the_others({3: 1.0}) == {}
    assert medians_of_the_others({}) == {}


def test_a_straggler_among_1024_workers_stands_out():
    values = {w: 2.0 + 0.001 * (w % 7) for w in range(1024)}
    values[611] = 6.0
    medians = medians_of_the_others(values)
    assert medians[611] == statistics.median(v for w, v in values.items() if w != 611)
    assert values[611] / medians[611] > 2.9
