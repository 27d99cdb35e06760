"""What crosses slices (trainer/planner/dcn.py), on synthetic HLO in the spellings libtpu prints for a
multislice program: pure, no compile (the compiled programs are in tests/trainer/test_plan.py)."""

from __future__ import annotations

import pytest

from trainer.planner import collectives, dcn, tpu_compile

# Two slices of v6e 2x2: logical ids 0-3 on slice 0, 4-7 on slice 1 (the device assignment's order).
TWO_SLICES = {i: i // 4 for i in range(8)}


@pytest.mark.parametrize("attrs, groups", [
    ("replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups={{0,4},{1,5},{2,6},{3,7}}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=[2,4]<=[8], dimensions={0}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("source_target_pairs={{0,4},{4,0}}", [[0, 4], [4, 0]]),
    ("replica_groups={}, to_apply=%add", None),
])
def test_replica_groups_are_read_in_every_spelling(attrs, groups):
    assert dcn.replica_groups(attrs) == groups


def test_groups_are_classified_by_the_slices_they_span():
    within = dcn.replica_groups("replica_groups=[2,4]<=[8]")
    across = dcn.replica_groups("replica_groups=[4,2]<=[2,4]T(1,0)")
    assert dcn.slices_spanned(within, TWO_SLICES) == 1
    assert dcn.slices_spanned(across, TWO_SLICES) == 2
    assert dcn.slices_spanned(across, dict.fromkeys(range(8), 0)) == 1  # one slice: nothing crosses
    # The same groups on a slice map where 0-3 and 4-7 are interleaved: now the first crosses, the second not.
    interleaved = {i: i % 2 for i in range(8)}
    assert dcn.slices_spanned(within, interleaved) == 2 and dcn.slices_spanned(across, interleaved) == 1


def test_a_collective_whose_groups_span_slices_moves_its_share_over_the_dcn():
    # An all-reduce of 4 MB over all 8 chips of 2 slices: inside each slice over ICI, then each chip's quarter
    # across slices (2 (k-1)/k of 1 MB = 1 MB a chip).
    op = dcn.crossing_op("all-reduce", 4_000_000, "replica_groups={{0,1,2,3,4,5,6,7}}", TWO_SLICES, 8)
    assert op == dcn.DcnOp("all-reduce", 1_000_000, 1_000_000, 2) and op.wire_bytes == 1_000_000
    assert dcn.crossing_op("all-reduce", 4_000_000, "replica_groups=[2,4]<=[8]", TWO_SLICES, 8) is None
    # Empty groups, or named mesh axes: the program is one slice's (libtpu's multislice), so they stay in it.
    assert dcn.crossing_op("all-gather", 800, "replica_groups={}", TWO_SLICES, 8) is None
    named = "replica_groups=mesh['axis_0'=4] {'axis_0'}"
    assert dcn.crossing_op("all-reduce", 800, named, TWO_SLICES, 8) is None
    assert dcn.crossing_op("all-gather", 800, "replica_groups={{0,4}}", TWO_SLICES, 8).wire_bytes == 400
    # Counted on the DCN, left out of the ICI collectives.
    hlo = ("  %all-reduce.1 = f32[1000]{0} all-reduce(%a), replica_groups={{0,4},{1,5},{2,6},{3,7}}\n"
           "  %all-reduce.2 = f32[1000]{0} all-reduce(%b), replica_groups={{0,1,2,3},{4,5,6,7}}\n")
    crossing = []

    def skip(kind, nbytes, attrs):
        op = dcn.crossing_op(kind, nbytes, attrs, TWO_SLICES, 8)
        crossing.append(op) if op else None
        return op is not None

    ici = collectives.collectives_in(hlo, 4, skip)
    assert ici.count == 1 and ici.ops[0].group == 4
    assert crossing == [dcn.DcnOp("all-reduce", 4000, 4000, 2)]


# What libtpu 0.0.42 compiles for a gradient over 2 slices of v6e 4x4 (trimmed): the slice's own all-reduce,
# then its chip's 1/16 share across slices as a megascale send/recv pair.
def _transfer(op: str, shape: str, rendezvous: str, target: str, kind: str) -> str:
    target = target if target.startswith("{{") else f'"{target}"'
    return (
        f"  %{op}.{rendezvous} = ({shape}{{1,0:T(8,128)}}, u32[], token[]) {op}(%x, %after-all),"
        ' channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name='
        f'"xla_megascale_runtime",_xla_host_transfer_rendezvous="{rendezvous}",'
        f'_xla_megascale_target={target},_xla_megascale_transfer_type="{kind}"}}, backend_config={{}}'
    )


MEGASCALE_HLO = "\n".join([
    "  %all-reduce.2 = f32[1024,1024]{0,1:T(8,128)S(1)} all-reduce(%fusion), channel_id=3,"
    " replica_groups={{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}}, use_global_device_ids=true, to_apply=%add",
    _transfer("send", "f32[64,8,128]", "all-reduce.1_0", "{1,2}x{0:15}", "ALL_REDUCE"),
    _transfer("recv", "f32[64,8,128]", "all-reduce.1_0", "{1,2}x{0:15}", "ALL_REDUCE"),
    "  %send-done = token[] send-done(%send), channel_id=2, is_host_transfer=true",
    "  %recv-done = (f32[64,8,128]{2,1,0}, token[]) recv-done(%recv), channel_id=1, is_host_transfer=true",
    _transfer("send", "f32[32,1024]", "all-gather_0", "{1,2,3,4}x{0:3}", "ALL_GATHER"),
    _transfer("recv", "f32[128,1024]", "all-gather_0", "{1,2,3,4}x{0:3}", "ALL_GATHER"),
    _transfer("send", "f32[8,8,128]", "all-to-all_0",
              "{{100000,100001,100002,100003,200000,200001,200002,200003}}", "ALL_TO_ALL"),
])


def test_megascale_transfers_are_found_with_their_payload_and_slices():
    ops = dcn.megascale_ops(MEGASCALE_HLO)
    assert ops == [
        dcn.DcnOp("all-reduce", 64 * 8 * 128 * 4, 64 * 8 * 128 * 4, 2),  # one per rendezvous, not per line
        dcn.DcnOp("all-gather", 32 * 1024 * 4, 128 * 1024 * 4, 4),
        dcn.DcnOp("all-to-all", 8 * 8 * 128 * 4, 0, 2),  # global ids 1xxxxx and 2xxxxx: two slices
    ]
    share = 64 * 8 * 128 * 4  # a chip's 1/16 of the 4 MiB gradient
    assert [op.wire_bytes for op in ops] == [share, 3 / 4 * 128 * 1024 * 4, 1 / 2 * 8 * 8 * 128 * 4]
    # The slice's own all-reduce stays an ICI collective.
    assert collectives.collectives_in(MEGASCALE_HLO, 16).by_kind == {"all-reduce": [1, 1024 * 1024 * 4]}
    assert dcn.ops_wire_bytes(dcn.grouped(ops)) == pytest.approx(sum(op.wire_bytes for op in ops))
    assert dcn.megascale_ops(MEGASCALE_HLO.replace("is_host_transfer=true", "")) == []


def test_bytes_on_the_dcn_by_kind():
    assert dcn.wire_bytes("all-reduce", 1000, 1000, 4) == pytest.approx(1500)
    assert dcn.wire_bytes("all-gather", 250, 1000, 4) == pytest.approx(750)
    assert dcn.wire_bytes("reduce-scatter", 1000, 250, 4) == pytest.approx(750)
    assert dcn.wire_bytes("all-reduce", 1000, 1000, 1) == 0
    assert dcn.target_slices("{1,2,3}x{0:15}") == 3
    assert dcn.target_slices("{{5,6}}", {5: 0, 6: 1}) == 2


# ---- the tiny model planned on 2 slices of v6e 2x2 (libtpu compiles it here) -------------------------------

needs_libtpu = pytest.mark.skipif(tpu_compile.libtpu_version() is None, reason="libtpu is not installed")


@needs_libtpu
def test_the_update_on_two_slices_all_reduces_its_gradients_across_them(tmp_path, tiny_model_dir):
    from tests.trainer.launch import planning_config
    from trainer.config import load_config
    from trainer.planner.plan import build_plan
    from trainer.planner.report import format_plan
    from trainer.planner.tpu_specs import parse_accelerator_type

    cfg = load_config(planning_config(tmp_path, tiny_model_dir), [])
    v6e4 = parse_accelerator_type("v6e-4")
    plan = build_plan(cfg, v6e4, only={"update", "decode loop"}, slices=2)  # one: tests/trainer/test_plan.py
    two = plan.to_json()
    assert two["mesh"] == {"dp": 2, "fsdp": 4, "tp": 1}
    assert two["slices"] == 2 and (two["chips"], two["hosts"]) == (4, 1)  # one slice's
    decode_loop, update_two = two["programs"]
    # The decode loop's condition (does any row of any slice go on?) waits on the other slice each token.
    assert dcn.per_token(decode_loop["dcn_ops"]) == [["all-reduce", 512, 512, 2, 1.0]]
    # Across slices: the gradients' all-reduce, each chip's share of them (its fsdp quarter of the fp32
    # parameters) summed with the other slice's, so at least that share crosses; the rest of the update
    # stays inside a slice. (The compiler sends more: the tied embedding's two gradients apart, small
    # tensors padded to whole tiles: 1.77x the share here.)
    kinds = {row[0] for row in update_two["dcn_ops"]}
    assert kinds == {"all-reduce"} and all(row[3] == 2 for row in update_two["dcn_ops"])
    params_per_chip = two["resident_bytes"]["parameters"]
    assert params_per_chip <= update_two["dcn_bytes"] <= 2 * params_per_chip
    net = two["network_step"]
    assert net["dcn_bytes_per_chip"] == pytest.approx(update_two["dcn_bytes"] + 32 * 512)  # 32 tokens
    assert 0 < net["dcn_s"][0] <= net["dcn_s"][1] and net["ici_bytes_per_chip"] > 0
    low, high = update_two["estimated_seconds"]
    assert low >= update_two["dcn_seconds"][0] and high >= update_two["dcn_seconds"][1]
    assert "DCN across 2 slices" in format_plan(plan)


def test_a_mesh_that_cannot_span_the_slices_is_one_line(tmp_path, tiny_model_dir, capsys):
    from tests.trainer.launch import planning_config
    from trainer.planner.plan import EXIT_BAD_INPUT, main

    if tpu_compile.libtpu_version() is None:  # the shape check comes after libtpu describes the slices
        pytest.skip("libtpu is not installed")
    config = planning_config(tmp_path, tiny_model_dir)
    args = ["--config", config, "--topology", "v6e-4", "--quiet", "--set", "mesh_shape=1,-1,1"]
    assert main([*args, "--slices", "2"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dp=1, which cannot span 2 slices" in err[0] and "2 x v6e-4" in err[0]
    assert main([*args[:-2], "--slices", "0"]) == EXIT_BAD_INPUT
    assert "give 1 or more slices" in capsys.readouterr().err


def test_a_transfer_in_a_loop_counts_every_trip():
    # A gradient reduced across slices inside a micro-batch loop of 4 trips runs 4 times a step.
    hlo = "\n".join([
        "%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {",
        _transfer("send", "f32[64,8,128]", "all-reduce.1_0", "{1,2}x{0:15}", "ALL_REDUCE"),
        _transfer("recv", "f32[64,8,128]", "all-reduce.1_0", "{1,2}x{0:15}", "ALL_REDUCE"),
        "}",
        "%cond (p: (s32[], f32[8])) -> pred[] {",
        "}",
        "ENTRY %main (a: f32[8]) -> f32[8] {",
        '  %w = (s32[], f32[8]) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":'
        '{"n":"4"}}',
        _transfer("send", "f32[8,1024]", "all-gather_0", "{1,2}x{0:3}", "ALL_GATHER"),
        "}",
    ])
    ops = dcn.megascale_ops(hlo)
    assert [op.kind for op in ops] == ["all-reduce"] * 4 + ["all-gather"]
    assert all(op.per_iteration == 0 for op in ops)  # a loop of known length: counted by its trips


def test_a_transfer_in_an_open_ended_loop_runs_every_iteration():
    # The decode loop runs until every row has ended: its condition asks every slice (a pred all-reduce).
    # With two such loops (length buckets), each token runs one of them: half a transfer each, a token.
    def loop(n: int) -> list[str]:
        return [
            f"%body.{n} (p: (s32[], f32[8])) -> (s32[], f32[8]) {{",
            "}",
            f"%cond.{n} (p: (s32[], f32[8])) -> pred[] {{",
            _transfer("send", "pred[1,4,128]", f"all-reduce_{n}", "{1,2}x{0:3}", "ALL_REDUCE"),
            _transfer("recv", "pred[1,4,128]", f"all-reduce_{n}", "{1,2}x{0:3}", "ALL_REDUCE"),
            "}",
        ]
    hlo = "\n".join([*loop(1), *loop(2), "ENTRY %main (a: f32[8]) -> f32[8] {",
                     "  %w.1 = (s32[], f32[8]) while(%t), condition=%cond.1, body=%body.1",
                     "  %w.2 = (s32[], f32[8]) while(%w.1), condition=%cond.2, body=%body.2", "}"])
    ops = dcn.megascale_ops(hlo)
    assert [op.per_iteration for op in ops] == [0.5, 0.5]
    assert dcn.per_token(dcn.grouped(ops)) == [["all-reduce", 512, 512, 2, 1.0]]  # the two as one row
