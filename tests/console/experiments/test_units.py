"""The largest-batch search on its own: for every memory limit, doubling then bisecting over the values the
pod accepts finds the exact boundary, in few trials. The memory bench's reading of a worker's output."""

from __future__ import annotations

import json
import math

import pytest

from tpu_console.experiments.batch_sweep import next_value
from tpu_console.experiments.memory_bench import _EVENTS_MARK, _bench_event


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


def test_the_memory_bench_reads_its_event_among_output_lines_that_are_json_but_not_events():
    # The events are followed by output.log's tail, whose lines may be bare numbers, lists or null.
    bench = {"kind": "bench", "per_device_array_bytes_max": 8, "expected_per_device_bytes": 8}
    stdout = "\n".join(["compiling", _EVENTS_MARK, '{"kind": "start"}', json.dumps(bench),
                         "42", "[1, 2]", "null", "3.5", ""])
    assert _bench_event(stdout) == (bench, "3.5")


def test_the_memory_bench_names_the_error_event_or_else_the_last_output_line():
    error = "\n".join([_EVENTS_MARK, '{"kind": "error", "message": "RESOURCE_EXHAUSTED"}', "7"])
    assert _bench_event(error) == (None, "7")
    assert _bench_event("\n".join([_EVENTS_MARK, "7", '{"kind": "error", "message": "OOM"}'])) == (
        None,
        "OOM",
    )
    assert _bench_event("\n".join([_EVENTS_MARK, "Traceback", "  boom", ""])) == (None, "boom")


def test_a_compile_only_sweep_on_several_slices_tries_only_what_all_their_hosts_divide():
    from pathlib import Path

    from tpu_console.experiments.planning import slice_candidates

    config = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "qwen25_3b_v6e16_bench.yaml"
    one = slice_candidates(config, [], "rollout.batch_size", "v6e-16", 16)
    two = slice_candidates(config, [], "rollout.batch_size", "v6e-16", 16, slices=2)
    assert [v for v, _ in one] == [4, 8, 12, 16]  # 4 hosts a slice
    assert two == [(8, 8), (16, 16)]  # 8 hosts: (value, sequences a host at n = 8)
