"""trainer/scanned.py: the Trainer's model with its blocks as one scanned layer (`train.scan_layers`).

The scanned model trains as the unrolled one does (the same loss and gradients), its stacked state survives a
checkpoint, its scanned rollout (stacked weights, a stacked KV cache) samples the unrolled model's tokens
with the weights where the layout puts them, and its programs compiled by libtpu hold the unrolled ones'
state with their flops and collectives once their loops are counted as often as they run."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer.launch import planning_config
from trainer.planner import tpu_compile

needs_libtpu = pytest.mark.skipif(tpu_compile.libtpu_version() is None, reason="libtpu is not installed")


def _loss_and_grads(model, batch, prompt_len):
    from flax import nnx

    from trainer.programs import completion_token_stats_fn

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    stats = completion_token_stats_fn(graphdef, prompt_len, chunk=2)

    def loss(p):
        positions = jnp.maximum(jnp.cumsum(batch["attention_mask"], axis=1) - 1, 0)
        logp, entropy = stats(p, rest, batch["input_ids"], positions, batch["attention_mask"],
                              batch["input_ids"][:, prompt_len:], 1.0)
        return jnp.sum(logp * batch["weights"]) + 0.1 * jnp.sum(entropy)

    return jax.jit(jax.value_and_grad(loss))(params)


def _assert_close(actual, desired, what=""):
    # fp32 sums taken in another order: within 1e-5 of each element, or 1e-4 of the tensor's largest entry.
    desired = np.asarray(desired)
    np.testing.assert_allclose(np.asarray(actual), desired, rtol=1e-5, atol=1e-4 * np.abs(desired).max(),
                               err_msg=what)


def test_scanned_model_trains_as_the_unrolled_one(tiny_model_dir, tmp_path):
    from trainer.checkpoint import Checkpointer
    from trainer.weights import load_model

    p, c, b = 6, 4, 3
    rng = np.random.default_rng(0)
    mask = np.ones((b, p + c), np.int32)
    mask[0, :2] = 0  # a left-padded row
    batch = {"input_ids": jnp.asarray(rng.integers(3, 200, size=(b, p + c)).astype(np.int32)),
             "attention_mask": jnp.asarray(mask),
             "weights": jnp.asarray(rng.normal(size=(b, c)), jnp.float32)}
    unrolled, config = load_model(tiny_model_dir, compute_dtype=jnp.float32, remat=False)
    scanned, _ = load_model(tiny_model_dir, compute_dtype=jnp.float32, remat=True, scan_layers=True)
    loss_u, grads_u = _loss_and_grads(unrolled, batch, p)
    loss_s, grads_s = _loss_and_grads(scanned, batch, p)
    np.testing.assert_allclose(float(loss_s), float(loss_u), rtol=1e-5)
    # Every block's gradient is its slice of the stacked gradient; the embedding's and final norm's alike.
    stacked = grads_s["layers"][0].to_pure_dict()
    for i in range(config.num_hidden_layers):
        layer = grads_u["layers"][i].to_pure_dict()
        for (path, g_u), g_s in zip(jax.tree_util.tree_leaves_with_path(layer), jax.tree.leaves(stacked),
                                    strict=True):
            _assert_close(g_s[i], g_u, f"layer {i} {jax.tree_util.keystr(path)}")
    _assert_close(grads_s["embed_tokens"], grads_u["embed_tokens"])
    _assert_close(grads_s["norm"]["scale"], grads_u["norm"]["scale"])
    assert float(jnp.abs(stacked["mlp"]["down_proj"]["kernel"]).max()) > 0

    # The stacked state round-trips through an orbax checkpoint with its shapes.
    from flax import nnx

    params = nnx.split(scanned, nnx.Param, ...)[1]
    checkpointer = Checkpointer(str(tmp_path / "ckpt"), 1, 1)
    checkpointer.save(1, {"params": params})
    checkpointer.close()
    restored = Checkpointer(str(tmp_path / "ckpt"), 1, 1).restore(1, {"params": params})["params"]
    for a, r in zip(jax.tree.leaves(params), jax.tree.leaves(restored), strict=True):
        assert a.shape == r.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(r))


def test_scanned_rollout_samples_the_unrolled_rollouts_tokens(tiny_model_dir):
    # One device, fp32 compute (the same logits to the last bits, so a sampled draw cannot flip): prefill
    # and decode scanned over the stacked weights and a stacked KV cache give the unrolled rollout's greedy
    # and sampled tokens, through a shared prefill (repeated prompts) and a cache grown over 3 segments.
    from flax import nnx

    from trainer.rollout.sampler import Sampler
    from trainer.weights import load_model

    unrolled, config = load_model(tiny_model_dir, compute_dtype=jnp.float32)
    scanned, _ = load_model(tiny_model_dir, compute_dtype=jnp.float32, scan_layers=True)
    prompts = [[5, 6, 7], [8, 9, 10, 11], [3, 4], [12]] * 2
    options = dict(buckets=(16,), max_new_tokens=8, attend_bucket=3)
    plain, stacked = (Sampler(m, 0, config.eos_token_ids, **options) for m in (unrolled, scanned))
    assert stacked.segments == (3, 6, 8)
    for mode in ({"greedy": True}, {"temperature": 0.7}):
        want, got = plain.generate(prompts, rng=3, **mode), stacked.generate(prompts, rng=3, **mode)
        np.testing.assert_array_equal(np.asarray(got.completion_ids), np.asarray(want.completion_ids))
        np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=1e-5)
    # The cache is one stacked (keys, values) pair, [layers, rows, kv heads, slots, head dim].
    ids, mask = stacked.pad_prompts(prompts[:4])
    cache = jax.eval_shape(functools.partial(stacked.prefill, top_k=0, use_top_p=False, greedy=True),
                           nnx.state(scanned), ids, mask, jax.random.key(0), 1.0, 1.0)[0]
    shape = (config.num_hidden_layers, 4, config.num_key_value_heads, 16 + 3, config.dim_per_head)
    assert isinstance(cache, tuple) and [x.shape for x in cache] == [shape, shape]


def test_scanned_rollout_keeps_the_weights_stacked_in_each_layout(tiny_model_dir):
    # On a 4-device mesh, for the CPU default (fsdp) and head_groups (the TPU default where the KV heads
    # divide the chips: every collective a shard_map inside the scan's body): the rollout's weights stay
    # stacked, each block laid out as the unrolled sampler lays out that block, the layer axis whole, with
    # the same values; and generate() gives the unrolled rollout's greedy tokens (fsdp) and greedy and
    # sampled tokens (head_groups).
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np
        from flax import nnx
        from jax.sharding import PartitionSpec
        from trainer.mesh import local_rows, make_mesh
        from trainer.rollout.sharded import ShardedSampler
        from trainer.rollout.stacked import StackedWeightsSampler
        from trainer.weights import load_model
        mesh = make_mesh("1,4,1")
        unrolled, config = load_model({str(tiny_model_dir)!r}, mesh=mesh, compute_dtype=jnp.float32)
        scanned, _ = load_model({str(tiny_model_dir)!r}, mesh=mesh, compute_dtype=jnp.float32,
                                scan_layers=True)
        prompts = [[5, 6, 7], [8, 9, 10, 11], [3, 4], [12]] * 2
        for layout, modes in (("fsdp", [{{"greedy": True}}]),
                              ("head_groups", [{{"greedy": True}}, {{"temperature": 1.0}}])):
            options = dict(prompt_len=16, max_new_tokens=4, mesh=mesh, weight_layout=layout)
            plain = ShardedSampler(unrolled, 0, config.eos_token_ids, **options)
            stacked = StackedWeightsSampler(scanned, 0, config.eos_token_ids, **options)
            want = plain.prepare_weights(nnx.state(unrolled)).to_pure_dict()
            got = stacked.prepare_weights(nnx.state(scanned)).to_pure_dict()
            for i, block in want.pop("layers").items():
                for w, g in zip(jax.tree.leaves(block), jax.tree.leaves(got["layers"][0]), strict=True):
                    assert g.shape == (config.num_hidden_layers, *w.shape)
                    assert g.sharding.spec == PartitionSpec(None, *w.sharding.spec), (layout, g.sharding)
                    np.testing.assert_array_equal(np.asarray(g[i]), np.asarray(w))
            got.pop("layers")
            for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
                assert w.sharding.is_equivalent_to(g.sharding, w.ndim)
            for mode in modes:
                a = plain.generate(prompts, rng=0, state=nnx.state(unrolled), **mode)
                b = stacked.generate(prompts, rng=0, state=nnx.state(scanned), **mode)
                np.testing.assert_array_equal(local_rows(a.completion_ids, mesh),
                                              local_rows(b.completion_ids, mesh))
        print("ok")
    """)
    env = os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=480, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@needs_libtpu
def test_a_scanned_config_plans_the_programs_it_runs(tmp_path, tiny_model_dir):
    # The plan of a scanned config compiles (libtpu, v6e 2x2) what its Trainer runs: the stacked weights
    # cast into the rollout's stacked bf16 copy, the scanned rollout (prefill, the decode loop and its step
    # over a stacked KV cache), the scanned update. Against the unrolled config's programs: the same
    # resident weights and cache, arguments and donated buffers to the byte and, with every loop counted as
    # often as it runs (trainer/planner/whole_cost.py: the update's 2 micro-batches and 2 blocks forward and
    # backward, the decode step's 2 blocks), the same flops and collectives, where cost_analysis() alone
    # counts a scanned block once; and the scanned decode loop holds no more memory per chip.
    from trainer.config import load_config
    from trainer.planner.plan import build_plan
    from trainer.planner.tpu_specs import parse_accelerator_type

    v6e4 = parse_accelerator_type("v6e-4")
    config = planning_config(tmp_path, tiny_model_dir)
    wanted = {"rollout weights", "prefill", "decode loop", "decode step", "update"}
    scanned_plan = build_plan(load_config(config, ["train.scan_layers=true"]), v6e4, only=wanted)
    unrolled_plan = build_plan(load_config(config, []), v6e4, only=wanted)
    programs = {p.name: p.compiled for p in scanned_plan.programs}
    unrolled_programs = {p.name: p.compiled for p in unrolled_plan.programs}
    assert set(programs) == set(unrolled_programs) == wanted
    assert scanned_plan.fits and not any(c.oom for c in programs.values())
    # The rollout's weights and KV cache: the same bytes a chip, the weights made from the same fp32 bytes.
    assert scanned_plan.resident["KV cache"] > 0 and scanned_plan.resident == unrolled_plan.resident
    weights = unrolled_programs["rollout weights"]
    assert programs["rollout weights"].argument_bytes == weights.argument_bytes
    # Its output: the same bf16 bytes, less the tile padding of the per-layer arrays (a v6e tile pads each
    # small array, the 1-D norms and biases, separately; stacked, they share one padded array).
    assert 0.95 * weights.output_bytes < programs["rollout weights"].output_bytes <= weights.output_bytes
    unrolled, scanned = unrolled_programs["update"], programs["update"]
    assert scanned.argument_bytes == unrolled.argument_bytes and scanned.alias_bytes == unrolled.alias_bytes
    assert unrolled.loop_trips == [2] and sorted(scanned.loop_trips) == [2, 2, 2]  # micro-batches; 2 blocks
    assert scanned.counted_flops < 0.7 * unrolled.counted_flops
    assert abs(scanned.flops / unrolled.flops - 1) < 0.03, (scanned.flops, unrolled.flops)
    assert unrolled.flops > 1.9 * unrolled.counted_flops  # two micro-batches, not one
    assert abs(scanned.collectives.bytes / unrolled.collectives.bytes - 1) < 0.03
    # One token (head_groups, auto on v6e-4): the layer loop's body counted twice, so the step's flops,
    # bytes and collectives are the unrolled step's (the rotary tables and mask placed once, before the
    # loop: DecodeLayout.tables), not one layer's.
    unrolled, scanned = unrolled_programs["decode step"], programs["decode step"]
    assert unrolled.loop_trips == [] and scanned.loop_trips == [2]
    assert scanned.counted_flops < 0.85 * scanned.flops
    assert abs(scanned.flops / unrolled.flops - 1) < 0.03, (scanned.flops, unrolled.flops)
    assert abs(scanned.bytes_accessed / unrolled.bytes_accessed - 1) < 0.1
    assert scanned.collectives.grouped() and sorted(scanned.collectives.grouped()) == sorted(
        unrolled.collectives.grouped())
    # The stacked cache is updated in place: the loop and the step hold no more than the unrolled ones.
    for name in ("decode loop", "decode step"):
        assert programs[name].peak_bytes <= unrolled_programs[name].peak_bytes, name
        assert programs[name].alias_bytes == unrolled_programs[name].alias_bytes, name
