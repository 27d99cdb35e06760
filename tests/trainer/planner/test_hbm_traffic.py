"""The bytes a compiled program moves across HBM (trainer/planner/hbm_traffic.py): on HLO text written as
libtpu prints it, and on a real compile for v6e, where the compiler's `bytes accessed` counts a prefetched
weight about five times."""

from __future__ import annotations

import pytest

from trainer.planner import tpu_compile
from trainer.planner.hbm_traffic import hbm_traffic
from trainer.planner.hlo_text import arrays

W = "bf16[2048,2752]{0,1:T(8,128)(2,1)}"  # 11,272,192 bytes in HBM
W_CHIP = "bf16[2048,2752]{0,1:T(8,128)(2,1)S(1)}"  # the same on chip
W_BYTES = 2048 * 2752 * 2


def test_memory_spaces_are_read_from_the_layouts():
    found = arrays(f"({W_CHIP}, {W}, u32[]{{:S(2)}})")
    assert [(a.nbytes, a.space) for a in found] == [(W_BYTES, 1), (W_BYTES, 0), (4, 2)]
    assert arrays("pred[128]{0:T(512)(128)(4,1)}")[0].nbytes == 128


def test_a_prefetched_weight_is_one_hbm_read():
    # The shape of the weight-count matmul as libtpu 0.0.42 compiles it for v6e.
    hlo = f"""
%fused_computation (param_0: bf16[32,2048], param_1: bf16[2048,2752]) -> f32[32,2752] {{
  %param_0 = bf16[32,2048]{{1,0:T(8,128)(2,1)}} parameter(0)
  %param_1 = {W_CHIP} parameter(1)
  ROOT %convolution.1 = f32[32,2752]{{1,0:T(8,128)}} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}}

ENTRY %main (param: bf16[32,2048], param.1: bf16[2048,2752]) -> f32[32,2752] {{
  %param.1 = {W} parameter(1), sharding={{devices=[1,4]<=[4]}}
  %copy-start = ({W_CHIP}, {W}, u32[]{{:S(2)}}) copy-start(%param.1), cross_program_prefetch_index=0
  %param = bf16[32,2048]{{1,0:T(8,128)(2,1)}} parameter(0), sharding={{replicated}}
  %copy-done = {W_CHIP} copy-done(%copy-start)
  ROOT %fusion = f32[32,2752]{{1,0:T(8,128)}} fusion(%param, %copy-done), calls=%fused_computation
}}
"""
    traffic = hbm_traffic(hlo)
    x, out = 32 * 2048 * 2, 32 * 2752 * 4
    assert traffic.bytes == W_BYTES + x + out
    assert traffic.by_op == {"copy-start": W_BYTES, "fusion": x + out}


def test_slices_in_place_updates_evictions_and_loops():
    cache, cache_chip = "bf16[16,448,128]{2,1,0:T(8,128)(2,1)}", "bf16[16,448,128]{2,1,0:T(8,128)(2,1)S(1)}"
    row = "bf16[16,1,128]{2,1,0:T(8,128)(2,1)}"
    piece = "bf16[4,448,128]{2,1,0:T(8,128)(2,1)S(1)}"
    stacked = "bf16[36,2048,256]{2,1,0:T(8,128)(2,1)}"  # scanned layers' weights: the body reads one layer
    hlo = f"""
%update (p0: bf16[16,448,128], p1: bf16[16,1,128], p2: s32[]) -> bf16[16,448,128] {{
  %p0 = {cache} parameter(0)
  %p1 = {row} parameter(1)
  %p2 = s32[]{{:T(128)}} parameter(2)
  %z = s32[]{{:T(128)}} constant(0)
  ROOT %dus = {cache} dynamic-update-slice(%p0, %p1, %z, %p2, %z)
}}

%layer (q0: bf16[36,2048,256], q1: s32[]) -> bf16[2048,256] {{
  %q0 = {stacked} parameter(0)
  %q1 = s32[]{{:T(128)}} parameter(1)
  %z.1 = s32[]{{:T(128)}} constant(0)
  ROOT %ds = bf16[1,2048,256]{{2,1,0:T(8,128)(2,1)}} dynamic-slice(%q0, %q1, %z.1, %z.1)
}}

%nests (r0: bf16[36,2048,256], r1: s32[]) -> bf16[2048,256] {{
  %r0 = {stacked} parameter(0)
  %r1 = s32[]{{:T(128)}} parameter(1)
  %inner = bf16[1,2048,256]{{2,1,0:T(8,128)(2,1)}} fusion(%r0, %r1), kind=kLoop, calls=%layer
  ROOT %flat = bf16[2048,256]{{1,0:T(8,128)(2,1)}} bitcast(%inner)
}}

%body (t: (s32[], bf16[36,2048,256])) -> (s32[], bf16[36,2048,256]) {{
  %t = (s32[]{{:T(128)}}, {stacked}) parameter(0)
  %i = s32[]{{:T(128)}} get-tuple-element(%t), index=0
  %w = {stacked} get-tuple-element(%t), index=1
  %one = bf16[1,2048,256]{{2,1,0:T(8,128)(2,1)S(1)}} fusion(%w, %i), kind=kLoop, calls=%layer
  %two = bf16[2048,256]{{1,0:T(8,128)(2,1)S(1)}} fusion(%w, %i), kind=kLoop, calls=%nests
  ROOT %r = (s32[]{{:T(128)}}, {stacked}) tuple(%i, %w)
}}

%cond (c: (s32[], bf16[36,2048,256])) -> pred[] {{
  %c = (s32[]{{:T(128)}}, {stacked}) parameter(0)
  %ci = s32[]{{:T(128)}} get-tuple-element(%c), index=0
  %n = s32[]{{:T(128)}} constant(36)
  ROOT %lt = pred[]{{:T(512)}} compare(%ci, %n), direction=LT
}}

ENTRY %main (a: bf16[16,448,128], b: bf16[16,1,128], k: s32[], s: bf16[36,2048,256]) -> bf16[16,448,128] {{
  %a = {cache} parameter(0)
  %b = {row} parameter(1)
  %k = s32[]{{:T(128)}} parameter(2)
  %s = {stacked} parameter(3)
  %zero = s32[]{{:T(128)}} constant(0)
  %init = (s32[]{{:T(128)}}, {stacked}) tuple(%zero, %s)
  %loop = (s32[]{{:T(128)}}, {stacked}) while(%init), condition=%cond, body=%body
  %in-place = {cache} fusion(%a, %b, %k), kind=kLoop, calls=%update
  %slice-start = (({cache}), {piece}, s32[]{{:S(2)}}) slice-start(%in-place), slice={{[0:4],[0:448],[0:128]}}
  %slice-done = {piece} slice-done(%slice-start)
  %evict-start = ({cache}, {cache_chip}, u32[]{{:S(2)}}) copy-start(%slice-done)
  ROOT %evict-done = {cache} copy-done(%evict-start)
}}
"""
    traffic = hbm_traffic(hlo)
    update = 16 * 128 * 2
    layer = 2048 * 256 * 2
    # The update read and written (and the 4-byte index in HBM); a layer a trip by each of the body's two
    # fusions, one slicing it itself, one through a fusion it nests (and the trip's counter).
    assert traffic.by_op["fusion"] == 2 * update + 4 + 2 * 36 * (layer + 4)
    assert traffic.by_op["slice-start"] == 4 * 448 * 128 * 2  # the slice, not the whole cache
    assert traffic.by_op["copy-done"] == 16 * 448 * 128 * 2  # the eviction writes its HBM result once
    assert "copy-start" not in traffic.by_op and "slice-done" not in traffic.by_op  # on-chip ends


@pytest.mark.skipif(tpu_compile.libtpu_version() is None, reason="libtpu is not installed")
def test_the_compilers_count_of_a_streamed_weight_against_the_hbm_traffic():
    """x[32, 2048] @ W[2048, 2752] compiled for v6e: the compiler's bytes accessed count W about five times,
    the HBM traffic once (plus x and the result)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from trainer.planner.tpu_specs import parse_accelerator_type

    mesh = Mesh(np.array(tpu_compile.tpu_devices(parse_accelerator_type("v6e-4"))).reshape(4), ("tp",))
    x = jax.ShapeDtypeStruct((32, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
    split = NamedSharding(mesh, PartitionSpec(None, "tp"))
    w = jax.ShapeDtypeStruct((2048, 4 * 2752), jnp.bfloat16, sharding=split)
    matmul = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    c = tpu_compile.compile_program("matmul", matmul, x, w)
    assert c.bytes_accessed / W_BYTES > 4
    assert c.hbm_traffic_bytes == W_BYTES + 32 * 2048 * 2 + 32 * 2752 * 4
