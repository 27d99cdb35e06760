"""The planner's time estimate (trainer/planner/estimate.py) and the collectives it prices
(trainer/planner/collectives.py), on synthetic HLO and figures: pure, no compile."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainer.planner import collectives
from trainer.planner.estimate import (
    HIGH,
    LOW,
    MEASURED_OVER_FLOOR,
    ProgramCost,
    Range,
    collective_seconds,
    dcn_range,
    expected_steps,
    group_axes,
    mean_cache_fraction,
    network_lines,
    network_step,
    price,
    rank,
    step_lines,
    wire_bytes,
)
from trainer.planner.tpu_specs import DCN_BANDWIDTH, GB, GENERATIONS, parse_accelerator_type

V6E16 = parse_accelerator_type("v6e-16")
H100_RUN = Path(__file__).resolve().parents[3] / "benchmarks/results/gpu_check_h100_2026-11-26.jsonl"
H100_SXM_DATA_SHEET_BYTES_PER_S = 3.35e12  # NVIDIA's H100 SXM5 80GB data sheet, HBM3


def test_collectives_count_every_array_of_a_tuple_and_their_group():
    # The shapes carry TPU tile annotations with parentheses (the old parser stopped at the first one and
    # kept only one array of a tuple); async ops name their groups on the -start and the result on the -done.
    hlo = "\n".join([
        "  %all-reduce.3 = (bf16[32,1,32]{2,0,1:T(8,128)(2,1)S(1)}, f32[32,1]{0,1:T(2,128)})"
        " all-reduce(%a, %b), replica_groups=mesh['axis_0'=1,'axis_1'=16] {'axis_1'}, to_apply=%add",
        "  %all-gather-start = (bf16[8,2048]{1,0}, bf16[128,2048]{1,0}) all-gather-start(%p),"
        " replica_groups=[4,4]<=[16], dimensions={0}",
        "  %all-gather-done = bf16[128,2048]{1,0} all-gather-done(%all-gather-start)",
        "  %all-to-all = f32[2,96,16,4]{1,3,0,2:T(4,128)} all-to-all(%c), replica_groups={{0,1},{2,3}}",
        "  %reduce-scatter = bf16[8,64]{1,0} reduce-scatter(%d), replica_groups={}, to_apply=%add",
        "  %collective-permute = s32[4]{0} collective-permute(%e), source_target_pairs={{0,1},{1,0}}",
        "  %fusion = f32[8]{0} fusion(%a), kind=kLoop",
    ])
    found = collectives.collectives_in(hlo, devices=16)
    assert found.count == 5
    ops = {op.kind: op for op in found.ops}
    assert ops["all-reduce"] == collectives.CollectiveOp("all-reduce", 32 * 32 * 2 + 32 * 4, 16)
    assert ops["all-gather"] == collectives.CollectiveOp("all-gather", 128 * 2048 * 2, 4)
    assert ops["all-to-all"].group == 2
    assert ops["reduce-scatter"].group == 16  # empty groups: every chip
    assert ops["collective-permute"] == collectives.CollectiveOp("collective-permute", 16, 2)
    assert sorted(found.grouped())[0] == ["all-gather", 128 * 2048 * 2, 4, 1]


def test_bytes_on_the_wire_depend_on_the_kind_and_the_group():
    r = 1_000_000
    assert wire_bytes("all-reduce", r, 16) == pytest.approx(2 * 15 / 16 * r)
    assert wire_bytes("all-gather", r, 16) == pytest.approx(15 / 16 * r)
    assert wire_bytes("all-to-all", r, 4) == pytest.approx(3 / 4 * r)
    assert wire_bytes("reduce-scatter", r, 4) == pytest.approx(3 * r)  # r is one chip's piece
    assert wire_bytes("collective-permute", r, 2) == r
    assert wire_bytes("all-reduce", r, 1) == 0


def test_groups_are_placed_on_whole_torus_axes():
    assert group_axes(16, (4, 4)) == (4, 4)
    assert group_axes(4, (4, 4)) == (4,)
    assert group_axes(8, (4, 4)) == (4, 2)
    assert group_axes(2, (2, 2, 2)) == (2,)


def test_a_collective_costs_its_fixed_cost_hops_and_bytes_at_the_links_it_uses():
    # An all-reduce of 1 MB over all 16 chips of a 4x4 v6e: 2 x (3 + 3) ring steps, every link (800 GB/s
    # bidirectional, 400 inbound); over 4 chips: one axis, 2 x 3 steps, half the links.
    whole = collective_seconds("all-reduce", 1e6, 16, V6E16, HIGH)
    # An all-reduce is two phases (reduce-scatter, all-gather): the fixed cost twice, the hops twice.
    assert whole == pytest.approx(2 * HIGH.fixed_s + 12 * HIGH.hop_s + 2 * 15 / 16 * 1e6 / (400 * GB))
    axis = collective_seconds("all-reduce", 1e6, 4, V6E16, LOW)
    assert axis == pytest.approx(2 * LOW.fixed_s + 6 * LOW.hop_s + 2 * 3 / 4 * 1e6 / (200 * GB))
    # The sourced latencies (scaling book): a latency-bound all-gather over an axis of 4, 3 hops, is 3 us by
    # the 1 us a hop at the low end and the 8 us measured on v5e at the high end.
    v5e = parse_accelerator_type("v5litepod-16")
    tiny = [collective_seconds("all-gather", 0, 4, v5e, end) for end in (LOW, HIGH)]
    assert tiny == [pytest.approx(3e-6), pytest.approx(8e-6)]
    assert collective_seconds("all-gather", 1e6, 1, V6E16, HIGH) == 0


def test_a_group_is_priced_where_the_compiled_program_puts_it():
    # v6e-16's chips by logical id as the trainer's host-major mesh orders them (libtpu's coordinates): a
    # host is a 2x2 square, two hosts a 4x2 block.
    coords = {0: (0, 0), 1: (1, 0), 2: (0, 1), 3: (1, 1), 4: (2, 0), 5: (3, 0), 6: (2, 1), 7: (3, 1),
              8: (0, 2), 9: (1, 2), 10: (0, 3), 11: (1, 3), 12: (2, 2), 13: (3, 2), 14: (2, 3), 15: (3, 3)}
    hosts = "replica_groups={{0,1,2,3},{4,5,6,7},{8,9,10,11},{12,13,14,15}}"
    torus_span = collectives.torus_span
    assert torus_span(hosts, coords) == (2, 2)
    assert torus_span("replica_groups=[2,8]<=[16]", coords) == (4, 2)  # two hosts
    assert torus_span("replica_groups={{0,4},{1,5}}", coords) == (3, 1)  # a ring passes the chip between
    assert torus_span("replica_groups={}", coords) == (4, 4)  # every chip
    assert torus_span("replica_groups=mesh['axis_0'=16] {'axis_0'}", coords) == ()  # not read: by size
    assert torus_span(hosts, {}) == ()
    hlo = f"  %ar = bf16[64,2048]{{1,0}} all-reduce(%y), {hosts}, to_apply=%add"
    found = collectives.collectives_in(hlo, 16, span=lambda attrs: collectives.torus_span(attrs, coords))
    assert found.grouped() == [["all-reduce", 64 * 2048 * 2, 4, 1, [2, 2]]]
    # A host's square: one hop a phase on each of two axes (all its links) against an axis of 4's three
    # hops on half of them, which is where a group of 4 is put when its place is not known.
    square = collective_seconds("all-reduce", 1e6, 4, V6E16, HIGH, span=(2, 2))
    assert square == pytest.approx(2 * HIGH.fixed_s + 4 * HIGH.hop_s + 2 * 3 / 4 * 1e6 / (400 * GB))
    assert collective_seconds("all-reduce", 1e6, 4, V6E16, HIGH) == pytest.approx(
        2 * HIGH.fixed_s + 6 * HIGH.hop_s + 2 * 3 / 4 * 1e6 / (200 * GB))
    # The rows a plan stores carry the span; rows without one (older plans) are placed by size.
    cost = ProgramCost(0, 0, 0, ops=[["all-reduce", 1e6, 4, 3, [2, 2]], ["all-reduce", 1e6, 4, 1]])
    assert price(cost, V6E16).high == pytest.approx(
        3 * square + collective_seconds("all-reduce", 1e6, 4, V6E16, HIGH))


def test_v4_and_v5p_interconnects_are_bidirectional_per_chip():
    # Cloud's v5p page: 1200 GBps bidirectional per chip; the v4 paper: six links of 50 GB/s each way.
    assert parse_accelerator_type("v5p-8").generation.ici_bandwidth == 1200 * GB
    assert parse_accelerator_type("v4-16").generation.ici_bandwidth == 600 * GB
    # One all-gather of 600 MB over a v4-16's 8 chips (2x2x2): each chip takes in 7/8 of it at 300 GB/s.
    v4 = parse_accelerator_type("v4-16")
    t = collective_seconds("all-gather", 600e6, 8, v4, LOW)
    assert t == pytest.approx(LOW.fixed_s + 3 * LOW.hop_s + 7 / 8 * 600e6 / (300 * GB))


def test_a_program_is_priced_from_the_floor_at_the_low_end_and_its_hbm_traffic_at_the_high_end():
    g = V6E16.generation
    ops = [["all-reduce", 4096, 16, 100]]
    cost = ProgramCost(flops=1e9, bytes_accessed=2.85e9, floor_bytes=0.79e9, ops=ops)
    r = price(cost, V6E16)
    per_low = collective_seconds("all-reduce", 4096, 16, V6E16, LOW)
    per_high = collective_seconds("all-reduce", 4096, 16, V6E16, HIGH)
    assert r.low == pytest.approx(0.79e9 / g.hbm_bandwidth + 100 * per_low)
    assert r.high == pytest.approx(2.85e9 / g.hbm_bandwidth + 100 * per_high)
    # Where the HLO's HBM traffic was counted (trainer/planner/hbm_traffic.py), it prices the high end instead
    # of the compiler's bytes accessed, which also count on-chip copies; but never below the floor times what
    # a real chip was measured to take over it.
    counted = price(ProgramCost(1e9, 2.85e9, 0.79e9, ops, hbm_traffic=2.5e9), V6E16)
    assert counted.low == pytest.approx(r.low)
    assert counted.high == pytest.approx(2.5e9 / g.hbm_bandwidth + 100 * per_high)
    near_floor = price(ProgramCost(1e9, 2.85e9, 0.79e9, ops, hbm_traffic=0.9e9), V6E16)
    assert near_floor.high == pytest.approx(MEASURED_OVER_FLOOR * 0.79e9 / g.hbm_bandwidth + 100 * per_high)
    # Compute-bound: the flops set both ends' first term.
    heavy = price(ProgramCost(flops=1e15, bytes_accessed=1e9, floor_bytes=1e8), V6E16)
    assert heavy.low == heavy.high == pytest.approx(1e15 / g.peak_bf16_flops)
    # A floor above the compiler's count (it cannot read less than it must) never makes low > high.
    odd = price(ProgramCost(flops=0, bytes_accessed=1e8, floor_bytes=1e9), V6E16)
    assert odd.low <= odd.high


def test_the_decode_loop_measured_on_an_h100_lies_inside_the_range():
    # The trainer's compiled decode loop on one H100 (no collectives) against its floor, from the run's own
    # lines: the floor there is at the measured bandwidth, the estimate's at the data sheet's.
    lines = [json.loads(line) for line in H100_RUN.read_text().splitlines()]
    measured_bandwidth = next(r["read_GBps"] for r in lines if r["section"] == "hbm") * 1e9
    loops = [r for r in lines if r["section"] == "trainer generate" and "x_floor" in r]
    assert sorted(r["rows"] for r in loops) == [8, 32, 128]
    assert max(r["x_floor"] for r in loops) > 1.2  # above the HLO count's 1.0x-1.2x: why the range widened
    data_sheet_floor_s = [r["floor_ms"] * 1e-3 * measured_bandwidth / H100_SXM_DATA_SHEET_BYTES_PER_S
                          for r in loops]
    over_floor = [r["ms_per_token"] * 1e-3 / f for r, f in zip(loops, data_sheet_floor_s, strict=True)]
    # A program with no collectives whose HLO traffic is 1.0x-1.2x its floor, as every layout's TPU decode
    # step is, priced on any generation: each measurement lies between its ends.
    g = V6E16.generation
    floor = 1e9
    for traffic in (1.0 * floor, 1.2 * floor):
        cost = ProgramCost(flops=0, bytes_accessed=5 * floor, floor_bytes=floor, hbm_traffic=traffic)
        r = price(cost, V6E16)
        low, high = r.low / (floor / g.hbm_bandwidth), r.high / (floor / g.hbm_bandwidth)
        assert low == pytest.approx(1.0)
        assert all(low <= x <= high for x in over_floor), (over_floor, high)
    assert max(over_floor) == pytest.approx(MEASURED_OVER_FLOOR, abs=0.01)  # the worst, not a wider guess


def test_a_layout_is_the_choice_only_where_it_wins_at_both_ends():
    sure = rank({"megatron": Range(1.0, 2.0), "fsdp": Range(1.5, 3.0)})
    assert sure.certain and sure.choice == "megatron"
    unsure = rank({"megatron": Range(0.9, 3.4), "head_groups": Range(1.2, 3.0), "fsdp": Range(1.0, 4.4)})
    assert not unsure.certain and unsure.choice == "head_groups"  # the smaller worst case
    assert (unsure.fastest_low, unsure.fastest_high) == ("megatron", "head_groups")
    assert "uncertain" in unsure.text()


def test_the_decode_loop_is_priced_at_the_longest_rows_measured_else_the_maximum():
    assert expected_steps([], 1024) == 1024
    assert expected_steps([300, 500, 2000], 1024) == pytest.approx((300 + 500 + 1024) / 3)
    # The floor reads the cache up to the loop's mean length: prompt 256 + half of 512 steps, of 1280 slots.
    assert mean_cache_fraction(256, 1024, 512) == pytest.approx(512 / 1280)
    assert mean_cache_fraction(256, 1024, 4096) == 1.0


def test_the_step_is_said_as_a_range_with_where_its_length_came_from():
    plan = {
        "step_estimate_s": {"rollout_generate_s": [1.0, 2.5], "update_s": [0.3, 0.4], "step_s": [1.3, 2.9]},
        "step_estimate_at_max_s": {"step_s": [3.0, 7.0]},
        "new_tokens": 1024,
        "expected_new_tokens": 412.0,
        "longest_rows_known": 3,
    }
    lines = step_lines(plan)
    assert "step_s 1.30..2.90" in lines[0] and "412 tokens" in lines[0] and "3 earlier steps" in lines[0]
    assert "1024 tokens: step_s 3.00..7.00" in lines[1]
    without = step_lines({**plan, "longest_rows_known": 0, "expected_new_tokens": 1024})
    assert "the config's maximum" in without[0]
    assert math.isclose(Range.from_json([1, 2]).high, 2) and Range.from_json(None) is None


def test_transfers_between_slices_cost_a_latency_and_their_bytes_at_the_chips_dcn_share():
    # v6e: 4 x 200 Gbps NICs a host of 8 chips, 100 Gbps (12.5 GB/s) a chip, published: the same at both ends.
    assert DCN_BANDWIDTH["v6e"].fast == DCN_BANDWIDTH["v6e"].slow == 12.5 * GB
    assert set(DCN_BANDWIDTH) == set(GENERATIONS) and DCN_BANDWIDTH["v4"].assumed
    # A gradient share of 100 MB a chip all-reduced over 2 slices: 100 MB on the wire, 8 ms, + 10 or 100 us.
    rows = [["all-reduce", 100e6, 100e6, 2, 1]]
    assert dcn_range(rows, V6E16) == Range(pytest.approx(8e-3 + 10e-6), pytest.approx(8e-3 + 100e-6))
    assert dcn_range([["all-reduce", 100e6, 100e6, 1, 1]], V6E16) == Range(0, 0)  # one slice: nothing
    # v4's figure is assumed: its range spans v5e's and v5p's per-chip figures.
    v4 = dcn_range(rows, parse_accelerator_type("v4-16"))
    assert v4.high - 100e-6 == pytest.approx(2 * (v4.low - 10e-6))
    # Added to the program's price, at each end.
    base = ProgramCost(flops=0, bytes_accessed=1e9, floor_bytes=1e8)
    with_dcn = ProgramCost(flops=0, bytes_accessed=1e9, floor_bytes=1e8, dcn_ops=rows)
    assert price(with_dcn, V6E16).low - price(base, V6E16).low == pytest.approx(8e-3 + 10e-6)
    assert price(with_dcn, V6E16).high - price(base, V6E16).high == pytest.approx(8e-3 + 100e-6)


def test_a_steps_traffic_adds_each_programs_runs_inside_and_between_slices():
    ici_ops = [["all-reduce", 1e6, 16, 1]]
    grads = [["all-reduce", 100e6, 100e6, 2, 1]]
    programs = {"decode step": (ici_ops, []), "update": (ici_ops, grads), "log-probs": (ici_ops, grads)}
    net = network_step(programs, V6E16, steps=100, logprob_passes=0, slices=2)
    assert net["ici_bytes_per_chip"] == pytest.approx(101 * wire_bytes("all-reduce", 1e6, 16))
    assert net["dcn_bytes_per_chip"] == pytest.approx(100e6)  # the update's; no log-prob pass
    assert net["dcn_bytes_per_host"] == pytest.approx(4 * 100e6)  # v6e-16: 4 chips a host
    assert net["dcn_s"] == pytest.approx([8e-3 + 10e-6, 8e-3 + 100e-6])
    plan = {"network_step": net, "programs": [
        {"name": "update", "runs": "1x every step", "dcn_ops": grads, "dcn_bytes": 100e6,
         "dcn_seconds": [8.01e-3, 8.1e-3]}]}
    text = "\n".join(network_lines(plan))
    assert "DCN across 2 slices 0.100 GB (0.400 GB a host)" in text and "at 100 Gbps a chip" in text
    assert "update (1x every step): 1 transfers between slices, 100.00 MB a chip, 8.01..8.10 ms" in text
    # The decode loop's wait on the other slices runs every token: 100 x (10 us + 512 B at 12.5 GB/s) more.
    loop_rows = [["all-reduce", 512, 512, 2, 3, 0.0], ["all-reduce", 512, 512, 2, 1, 1.0]]
    waits = {**programs, "decode loop": ([], loop_rows)}
    more = network_step(waits, V6E16, steps=100, logprob_passes=0, slices=2)
    assert more["dcn_bytes_per_chip"] - net["dcn_bytes_per_chip"] == pytest.approx(100 * 512)
    assert more["dcn_s"][0] - net["dcn_s"][0] == pytest.approx(100 * (10e-6 + 512 / 12.5e9))
    one = network_step(programs, V6E16, steps=100, logprob_passes=0)
    assert "DCN" not in "\n".join(network_lines({"network_step": one}))
