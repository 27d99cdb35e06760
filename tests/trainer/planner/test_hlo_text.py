"""The planner's HLO-text parser (trainer/planner/hlo_text.py), on lines as libtpu and XLA's CPU compiler
print them (the spellings the other planner tests use): pure text, no compile."""

from __future__ import annotations

import pytest

from trainer.planner.hlo_text import (
    arrays,
    frontend_attributes,
    parse_hlo,
    parse_instruction,
    replica_group_size,
    replica_groups,
    tuple_elements,
)

STACKED = "bf16[36,2048,256]{2,1,0:T(8,128)(2,1)}"
# A scan over 36 stacked layers as libtpu prints it (tests/trainer/planner/test_hbm_traffic.py), its counter
# started from a constant and compared against one in the condition; no known_trip_count.
SCAN = f"""
%body (t: (s32[], bf16[36,2048,256])) -> (s32[], bf16[36,2048,256]) {{
  %t = (s32[]{{:T(128)}}, {STACKED}) parameter(0)
  %i = s32[]{{:T(128)}} get-tuple-element(%t), index=0
  %w = {STACKED} get-tuple-element(%t), index=1
  %one = bf16[1,2048,256]{{2,1,0:T(8,128)(2,1)S(1)}} fusion(%w, %i), kind=kLoop, calls=%layer
  ROOT %r = (s32[]{{:T(128)}}, {STACKED}) tuple(%i, %w)
}}

%cond (c: (s32[], bf16[36,2048,256])) -> pred[] {{
  %c = (s32[]{{:T(128)}}, {STACKED}) parameter(0)
  %ci = s32[]{{:T(128)}} get-tuple-element(%c), index=0
  %n = s32[]{{:T(128)}} constant(36)
  ROOT %lt = pred[]{{:T(512)}} compare(%ci, %n), direction=LT
}}

ENTRY %main (s: bf16[36,2048,256]) -> (s32[], bf16[36,2048,256]) {{
  %s = {STACKED} parameter(0)
  %zero = s32[]{{:T(128)}} constant(0)
  %init = (s32[]{{:T(128)}}, {STACKED}) tuple(%zero, %s)
  ROOT %loop = (s32[]{{:T(128)}}, {STACKED}) while(%init), condition=%cond, body=%body
}}
"""


def test_computations_instructions_and_the_entry_are_read():
    module = parse_hlo(SCAN)
    assert list(module.computations) == ["body", "cond", "main"] and module.entry == "main"
    fusion = module.computations["body"].by_name["one"]
    assert (fusion.op, fusion.operands, fusion.called("calls")) == ("fusion", ["w", "i"], ["layer"])
    assert fusion.attribute("kind") == "kLoop" and fusion.attribute("index") is None
    assert module.computations["cond"].root.attribute("direction") == "LT"
    assert module.computations["cond"].by_name["n"].integer() == 36
    assert module.computations["main"].by_name["s"].inside == "0"  # a parameter's number


def test_a_loops_trip_count_is_read_from_its_counter_and_multiplies_its_bodys_runs():
    module = parse_hlo(SCAN)
    [loop] = module.loops
    assert (loop.name, loop.parent, loop.body, loop.condition) == ("loop", "main", "body", "cond")
    assert loop.trips == 36
    assert module.runs == {"main": 1, "cond": 1, "body": 36, "layer": 36}
    # Counted from 4, the counter runs 32 times; a condition that is not `i < constant` has no count.
    assert parse_hlo(SCAN.replace("constant(0)", "constant(4)")).loops[0].trips == 32
    assert parse_hlo(SCAN.replace("direction=LT", "direction=NE")).loops[0].trips is None


def test_the_compilers_known_trip_count_wins():
    # The backend config XLA's CPU compiler writes on a scan's while (jax 0.8).
    known = ', backend_config={"known_induction_variable":{"tuple_index":"0"},"known_trip_count":{"n":"3"}}'
    assert parse_hlo(SCAN.replace("body=%body\n", f"body=%body{known}\n")).loops[0].trips == 3


def test_a_loop_body_becomes_a_module_of_its_own():
    text = parse_hlo(SCAN.replace("kind=kLoop,", 'kind=kLoop, metadata={op_name="x" stack_frame_id=6},'))
    body = text.submodule("body")
    assert body.startswith("HloModule loop_body") and "ENTRY %body (t:" in body
    assert "%main" not in body and "%cond" not in body and "stack_frame_id" not in body
    assert parse_hlo(body).entry == "body"


def test_shapes_give_each_arrays_bytes_dims_and_memory_space():
    shape = "(bf16[32,1,32]{2,0,1:T(8,128)(2,1)S(1)}, f32[32,1]{0,1:T(2,128)}, u32[]{:S(2)}, token[])"
    assert [(a.dtype, a.dims, a.nbytes, a.space) for a in arrays(shape)] == [
        ("bf16", (32, 1, 32), 2048, 1), ("f32", (32, 1), 128, 0), ("u32", (), 4, 2)]
    nested = "((bf16[4]{0}), f32[2]{0}, s32[]{:S(2)})"
    assert tuple_elements(nested) == ["(bf16[4]{0})", "f32[2]{0}", "s32[]{:S(2)}"]
    assert arrays("s4[3]")[0].nbytes == 2 and arrays("pred[128]{0:T(512)(128)(4,1)}")[0].nbytes == 128


def test_lines_outside_a_computation_and_bare_names_are_kept():
    module = parse_hlo(
        "  %all-gather-start = (bf16[8,2048]{1,0}, bf16[128,2048]{1,0}) all-gather-start(%p),"
        " replica_groups=[4,4]<=[16], dimensions={0}\n"
        "  %all-gather-done = bf16[128,2048]{1,0} all-gather-done(%all-gather-start)\n"
    )
    assert module.entry is None and [i.op for i in module.loose] == ["all-gather-start", "all-gather-done"]
    assert module.loose[1].operands == ["all-gather-start"]
    bare = parse_instruction("  all-reduce.1 = f32[8]{0} all-reduce(x), to_apply=add")
    assert (bare.name, bare.operands) == ("all-reduce.1", ["x"])
    assert parse_instruction("}") is None and parse_instruction("ENTRY %main () -> f32[] {") is None


@pytest.mark.parametrize("attrs, size, groups", [
    ("replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add", 4, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add", 2, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['axis_0'=1,'axis_1'=16] {'axis_1'}, to_apply=%add", 16, None),
    ("source_target_pairs={{0,1},{1,0}}", 2, [[0, 1], [1, 0]]),
    ("replica_groups={}, to_apply=%add", None, None),
])
def test_replica_groups_in_each_spelling(attrs, size, groups):
    assert replica_group_size(attrs) == size
    assert replica_groups(attrs) == groups


def test_frontend_attributes_of_a_megascale_transfer():
    # A send as libtpu 0.0.42 writes it for 2 slices (tests/trainer/planner/test_dcn.py).
    line = (
        "  %send.all-reduce.1_0 = (f32[64,8,128]{1,0:T(8,128)}, u32[], token[]) send(%x, %after-all),"
        ' channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name='
        '"xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.1_0",'
        '_xla_megascale_target={{100000,200000}},_xla_megascale_transfer_type="ALL_REDUCE"}'
    )
    send = parse_instruction(line)
    assert (send.op, send.operands) == ("send", ["x", "after-all"])
    assert frontend_attributes(send.attrs) == {
        "_xla_host_transfer_handler_name": "xla_megascale_runtime",
        "_xla_host_transfer_rendezvous": "all-reduce.1_0",
        "_xla_megascale_target": "{{100000,200000}}",
        "_xla_megascale_transfer_type": "ALL_REDUCE",
    }
