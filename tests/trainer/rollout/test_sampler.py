"""Rollout sampler: padding, end tokens, sampling filters, log-prob consistency, compile counting, mesh."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trainer.rollout.sampler import (
    INVERSE_CDF_BLOCK,
    TOP_P_CANDIDATES,
    Sampler,
    _inverse_cdf,
    sample_logits,
    sample_with_uniform,
)

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20]]


def _sampler(tiny_model, **kwargs) -> Sampler:
    model, config = tiny_model
    options = {"buckets": (8, 16), "max_new_tokens": 12} | kwargs
    return Sampler(model, pad_id=0, eos_ids=config.eos_token_ids, **options)


def test_sample_logits_filters_and_logprobs():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(4, 50)) * 3, jnp.float32)
    rng = jax.random.key(0)
    greedy, greedy_lp = sample_logits(logits, rng, 1.0, 1.0, top_k=0, use_top_p=False, greedy=True)
    np.testing.assert_array_equal(greedy, jnp.argmax(logits, -1))
    np.testing.assert_allclose(greedy_lp, jnp.max(jax.nn.log_softmax(logits), -1), rtol=1e-6)
    top1, _ = sample_logits(logits, rng, 1.0, 1.0, top_k=1, use_top_p=False, greedy=False)
    np.testing.assert_array_equal(top1, greedy)
    tiny_p, _ = sample_logits(logits, rng, 1.0, 1e-6, top_k=0, use_top_p=True, greedy=False)
    np.testing.assert_array_equal(tiny_p, greedy)
    # Many draws with top_k=3 stay inside each row's 3 best tokens; log-probs use logits / temperature.
    draw = jax.vmap(lambda key: sample_logits(logits, key, 0.5, 1.0, top_k=3, use_top_p=False, greedy=False))
    tokens, logprobs = draw(jax.random.split(rng, 200))
    allowed = np.asarray(jax.lax.top_k(logits, 3)[1])
    assert all(np.isin(np.asarray(tokens)[:, row], allowed[row]).all() for row in range(4))
    assert len(np.unique(np.asarray(tokens)[:, 0])) > 1
    expected = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits / 0.5)), np.asarray(tokens).T, 1).T
    np.testing.assert_allclose(np.asarray(logprobs), expected, rtol=1e-5)


def _reference_draw(logits: np.ndarray, u: np.ndarray, top_p: float) -> np.ndarray:
    """Nucleus draw by sorting the whole row in numpy: the smallest prefix reaching top_p, inverse CDF on
    it."""
    out = []
    for row, ui in zip(logits, u, strict=True):
        order = np.argsort(-row, kind="stable")
        probs = np.exp(row[order] - row.max())
        probs /= probs.sum()
        kept = probs[(np.cumsum(probs) - probs) < top_p]
        cdf = np.cumsum(kept)
        out.append(order[min(int(np.sum(cdf <= ui * cdf[-1])), len(kept) - 1)])
    return np.asarray(out)


@pytest.mark.parametrize("scale", [8.0, 0.01])  # peaked: nucleus within the candidates; flat: full sort
def test_top_p_bounded_candidates_draw_like_a_full_sort(scale):
    vocab = 2 * TOP_P_CANDIDATES
    logits = np.random.default_rng(1).normal(size=(6, vocab)).astype(np.float32) * scale
    u = np.random.default_rng(2).uniform(size=6).astype(np.float32)
    tokens, _ = jax.jit(
        lambda lg, u: sample_with_uniform(lg, u, 1.0, 0.9, top_k=0, use_top_p=True, greedy=False)
    )(logits, u)
    np.testing.assert_array_equal(np.asarray(tokens), _reference_draw(logits, u, 0.9))


def test_untruncated_draws_follow_the_softmax():
    logits = jnp.asarray([[2.0, 0.0, -1.0, -jnp.inf, 1.0]], jnp.float32)
    u = jnp.linspace(0.0, 1.0, 4000, endpoint=False)
    draw = jax.vmap(
        lambda ui: sample_with_uniform(logits, ui[None], 1.0, 1.0, top_k=0, use_top_p=False, greedy=False)[0][
            0
        ]
    )
    counts = np.bincount(np.asarray(draw(u)), minlength=5) / 4000
    np.testing.assert_allclose(counts, np.asarray(jax.nn.softmax(logits[0])), atol=1e-3)


def test_generate_left_pads_to_bucket_and_masks(tiny_model):
    sampler = _sampler(tiny_model)
    batch = sampler.generate(PROMPTS, rng=0, temperature=1.0)
    ids, mask = np.asarray(batch.prompt_ids), np.asarray(batch.prompt_mask)
    assert ids.shape == (3, 16) and mask.shape == (3, 16)  # the 9-token prompt needs bucket 16
    assert ids[1].tolist() == [0] * 14 + [10, 11] and mask[1].tolist() == [0] * 14 + [1, 1]
    assert batch.completion_ids.shape == batch.completion_mask.shape == batch.logprobs.shape == (3, 12)
    assert batch.logprobs.dtype == jnp.float32
    assert np.all(np.asarray(batch.logprobs)[np.asarray(batch.completion_mask) == 1] < 0)


def test_end_token_stops_a_row_and_pads_after_it(tiny_model):
    model, _ = tiny_model
    plain = _sampler(tiny_model).generate(PROMPTS, rng=0, greedy=True)
    # Make the 3rd greedy token of row 0 an end token: that row ends there, the others go on.
    end = int(plain.completion_ids[0, 2])
    others = np.asarray(plain.completion_ids[1:])
    stopped = Sampler(model, pad_id=0, eos_ids=[end], buckets=(8, 16), max_new_tokens=12).generate(
        PROMPTS, rng=0, greedy=True
    )
    ids, mask, logprobs = (
        np.asarray(x) for x in (stopped.completion_ids, stopped.completion_mask, stopped.logprobs)
    )
    first_end = int(np.argmax(np.asarray(plain.completion_ids[0]) == end))
    assert mask[0].tolist() == [1] * (first_end + 1) + [0] * (11 - first_end)
    assert (ids[0, first_end + 1 :] == 0).all() and (logprobs[0, first_end + 1 :] == 0).all()
    for row in (1, 2):
        if end not in others[row - 1]:
            assert mask[row].all() and (ids[row] == others[row - 1]).all()


def test_every_row_ending_at_once_exits_early(tiny_model):
    model, config = tiny_model
    everything = list(range(config.vocab_size))
    batch = Sampler(model, pad_id=0, eos_ids=everything, buckets=(16,), max_new_tokens=12).generate(
        PROMPTS, rng=3, temperature=1.0
    )
    assert np.asarray(batch.completion_mask).tolist() == [[1] + [0] * 11] * 3
    assert (np.asarray(batch.completion_ids)[:, 1:] == 0).all()


def test_logprobs_match_the_training_forward_at_sampling_temperature(tiny_model):
    model, _ = tiny_model
    temperature = 0.7
    batch = _sampler(tiny_model).generate(PROMPTS, rng=1, temperature=temperature, top_k=40, top_p=0.95)
    ids = jnp.concatenate([batch.prompt_ids, batch.completion_ids], axis=1)
    mask = jnp.concatenate([batch.prompt_mask, batch.completion_mask], axis=1)
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    logits = nnx.jit(lambda m, *a: m(*a))(model, ids, positions, mask)
    prompt_len = batch.prompt_ids.shape[1]
    scores = jax.nn.log_softmax(logits[:, prompt_len - 1 : -1] / temperature, axis=-1)
    expected = jnp.take_along_axis(scores, batch.completion_ids[..., None], axis=-1)[..., 0]
    valid = np.asarray(batch.completion_mask) == 1
    np.testing.assert_allclose(np.asarray(batch.logprobs)[valid], np.asarray(expected)[valid], atol=1e-4)


def test_compiles_once_per_bucket_and_reuses_it(tiny_model):
    sampler = _sampler(tiny_model)
    sampler.generate(PROMPTS, rng=0, temperature=1.0, top_k=5)
    after_first = sampler.compile_count
    assert after_first == 2  # prefill + decode
    sampler.generate([[1, 2], [3, 4, 5], [6] * 16], rng=1, temperature=0.3, top_k=5)  # same bucket 16
    assert sampler.compile_count == after_first
    sampler.generate([[1, 2], [3], [4]], rng=2, temperature=1.0, top_k=5)  # bucket 8: new shapes
    assert sampler.compile_count == after_first + 2
    first = sampler.generate(PROMPTS, rng=7, temperature=1.0, top_k=5)
    again = sampler.generate(PROMPTS, rng=7, temperature=1.0, top_k=5)
    np.testing.assert_array_equal(first.completion_ids, again.completion_ids)  # same rng, same tokens
    assert sampler.compile_count == after_first + 2


def test_bad_requests_are_explained(tiny_model):
    sampler = _sampler(tiny_model)
    with pytest.raises(ValueError, match="largest bucket 16"):
        sampler.generate([[1] * 17], rng=0)
    with pytest.raises(ValueError, match="non-empty"):
        sampler.generate([[1], []], rng=0)
    with pytest.raises(ValueError, match="greedy=True"):
        sampler.generate([[1]], rng=0, temperature=0.0)


def test_sharded_model_on_a_mesh_generates_the_same_tokens(tiny_model_dir):
    # Needs several CPU devices, which must be set before JAX starts: run in a fresh interpreter.
    script = textwrap.dedent(f"""
        import jax.numpy as jnp, numpy as np
        from trainer.mesh import make_mesh
        from trainer.rollout.sampler import Sampler
        from trainer.weights import load_model
        prompts = {PROMPTS!r} + [[3, 4]]
        mesh = make_mesh("1,2,2")
        sharded, config = load_model({str(tiny_model_dir)!r}, mesh=mesh, compute_dtype=jnp.float32)
        spec = sharded.layers[0].mlp.gate_proj.kernel[...].sharding.spec
        assert tuple(spec) == ("fsdp", "tp"), spec
        single, _ = load_model({str(tiny_model_dir)!r}, compute_dtype=jnp.float32)
        out = [Sampler(m, 0, config.eos_token_ids, buckets=(16,), max_new_tokens=8, mesh=mesh_).generate(
                   prompts, rng=0, greedy=True) for m, mesh_ in ((sharded, mesh), (single, None))]
        ids = out[0].completion_ids
        assert ids.sharding.shard_shape(ids.shape) == (2, 8), ids.sharding  # rows split over dp*fsdp
        np.testing.assert_array_equal(out[0].completion_ids, out[1].completion_ids)
        np.testing.assert_allclose(out[0].logprobs, out[1].logprobs, atol=1e-4)
        print("ok")
    """)
    env = os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=480, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_rollout_weight_layouts_sample_the_same_tokens(tiny_model_dir):
    # The tensor layout decodes on a second mesh (hosts x chips per host) over the same devices: the same
    # greedy tokens and log-probs as FSDP weights, its weights split over tp (KV projections whole: the tiny
    # model's 2 KV heads do not divide over 4 chips), and the tokens come back readable on the train mesh.
    script = textwrap.dedent(f"""
        import jax.numpy as jnp, numpy as np
        from trainer.mesh import local_rows, make_mesh
        from trainer.rollout.sharded import ShardedSampler
        from trainer.weights import load_model
        prompts = ({PROMPTS!r} + [[3, 4]]) * 2  # repeated prompts: one prefill each, shared
        mesh = make_mesh("1,4,1")
        model, config = load_model({str(tiny_model_dir)!r}, mesh=mesh, compute_dtype=jnp.float32)
        assert config.num_key_value_heads % 4, config
        out = {{}}
        for layout in ("fsdp", "replicated", "tensor"):
            sampler = ShardedSampler(model, 0, config.eos_token_ids, prompt_len=16, max_new_tokens=8,
                                     mesh=mesh, style="legacy", weight_layout=layout, attend_bucket=4)
            out[layout] = sampler.generate(prompts, rng=0, greedy=True)
            if layout == "tensor":
                assert dict(sampler.mesh.shape) == {{"dp": 1, "fsdp": 1, "tp": 4}}, sampler.mesh
                weights = sampler.prepare_weights(__import__("flax").nnx.state(model))
                layer = weights["layers"][0]
                gate = layer["mlp"]["gate_proj"]["kernel"][...]
                k = layer["self_attn"]["k_proj"]["kernel"][...]
                assert gate.sharding.shard_shape(gate.shape) == (gate.shape[0], gate.shape[1] // 4)
                assert k.sharding.shard_shape(k.shape) == k.shape
        for layout in ("replicated", "tensor"):
            np.testing.assert_array_equal(local_rows(out[layout].completion_ids, mesh),
                                          local_rows(out["fsdp"].completion_ids, mesh))
            np.testing.assert_allclose(local_rows(out[layout].logprobs, mesh),
                                       local_rows(out["fsdp"].logprobs, mesh), atol=1e-4)
        print("ok")
    """)
    env = os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=480, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_explicit_layouts_sample_what_fsdp_weights_sample(tiny_model_dir):
    # The megatron and head_groups layouts (explicit collectives, the vocabulary split over every device and
    # sampled where it lies) on a mesh using all three axes: the same greedy tokens and log-probs as FSDP
    # weights, the same sampled tokens at temperature 1 and with top-k (which gathers the logits to their
    # rows; the sampling code is shared, so megatron alone), their weights split as they say, and the same
    # greedy tokens again for a model with its own head (untied, [hidden, vocab], as Qwen2.5-7B). head_groups
    # also with two copies of the weights (rollout.weight_copies), each decoding its own rows on 4 devices.
    script = textwrap.dedent(f"""
        import dataclasses, tempfile
        import jax.numpy as jnp, numpy as np
        from flax import nnx
        from trainer.mesh import local_rows, make_mesh
        from trainer.model import create_model
        from trainer.rollout.sharded import ShardedSampler
        from trainer.weights import load_model, save_model
        # Each prompt twice (one prefill each, shared); the cache in two segments (4 new tokens, then 8).
        prompts = ({PROMPTS!r} + [[3, 4], [7], [8, 9, 10], [11, 12], [13, 14, 15, 16, 17]]) * 2
        mesh = make_mesh("2,2,2")
        model, config = load_model({str(tiny_model_dir)!r}, mesh=mesh, compute_dtype=jnp.float32)
        out = {{}}
        kv = config.num_key_value_heads
        for layout in ("fsdp", "megatron", "head_groups", "head_groups x2"):
            copies = 2 if layout.endswith("x2") else 1
            sampler = ShardedSampler(model, 0, config.eos_token_ids, prompt_len=16, max_new_tokens=8,
                                     mesh=mesh, style="legacy", weight_layout=layout.split()[0],
                                     weight_copies=copies, attend_bucket=4)
            out[layout] = [sampler.generate(prompts, rng=0, greedy=True),
                           sampler.generate(prompts, rng=1, temperature=1.0)]
            if not layout.startswith("head_groups"):
                out[layout].append(sampler.generate(prompts, rng=2, temperature=1.0, top_k=5))
            if layout == "fsdp":
                continue
            weights = sampler.prepare_weights(nnx.state(model))
            layer = weights["layers"][0]
            gate = layer["mlp"]["gate_proj"]["kernel"][...]
            down = layer["mlp"]["down_proj"]["kernel"][...]
            q = layer["self_attn"]["q_proj"]["kernel"][...]
            o = layer["self_attn"]["o_proj"]["kernel"][...]
            table = weights["embed_tokens"][...]
            per_copy = 8 // copies  # a copy's devices
            assert gate.sharding.shard_shape(gate.shape) == (gate.shape[0], gate.shape[1] // per_copy)
            assert down.sharding.shard_shape(down.shape) == (down.shape[0] // per_copy, down.shape[1])
            assert table.sharding.shard_shape(table.shape) == (table.shape[0] // per_copy, table.shape[1])
            if layout == "megatron":
                assert q.sharding.shard_shape(q.shape) == (q.shape[0] // 8, q.shape[1])
            else:  # a KV head's group of query heads, whole over the hidden dim
                assert dict(sampler.mesh.shape) == {{"dp": copies, "fsdp": per_copy // kv, "tp": kv}}, \
                    sampler.mesh
                assert q.sharding.shard_shape(q.shape) == (q.shape[0], q.shape[1] // kv)
                assert o.sharding.shard_shape(o.shape) == (o.shape[0] // kv, o.shape[1])
        untied = dataclasses.replace(config, tie_word_embeddings=False)
        folder = tempfile.mkdtemp()
        save_model(create_model(untied, seed=3, compute_dtype=jnp.float32), untied, folder)
        model, _ = load_model(folder, mesh=mesh, compute_dtype=jnp.float32)
        assert model.lm_head is not None
        for layout in ("fsdp", "megatron"):
            sampler = ShardedSampler(model, 0, config.eos_token_ids, prompt_len=16, max_new_tokens=8,
                                     mesh=mesh, style="legacy", weight_layout=layout)
            out["untied " + layout] = [sampler.generate(prompts, rng=0, greedy=True)]
        for layout, reference in (("megatron", "fsdp"), ("head_groups", "fsdp"), ("head_groups x2", "fsdp"),
                                  ("untied megatron", "untied fsdp")):
            for mine, fsdp in zip(out[layout], out[reference]):
                np.testing.assert_array_equal(local_rows(mine.completion_ids, mesh),
                                              local_rows(fsdp.completion_ids, mesh))
                np.testing.assert_allclose(local_rows(mine.logprobs, mesh), local_rows(fsdp.logprobs, mesh),
                                           atol=1e-4)
        print("ok")
    """)
    env = os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=480, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_two_level_inverse_cdf_draws_like_one_cumsum_over_the_row():
    # A vocabulary-sized row (not a multiple of the block) with masked tokens, including whole masked blocks
    # and a masked block start: same token as one cumulative sum over the row, for every uniform.
    rng = np.random.default_rng(3)
    vocab = 5 * INVERSE_CDF_BLOCK + 37
    logits = rng.normal(size=(8, vocab)).astype(np.float32) * 2
    logits[:, : 2 * INVERSE_CDF_BLOCK + 1] = -np.inf
    logits[:, rng.uniform(size=vocab) < 0.3] = -np.inf
    u = rng.uniform(size=8).astype(np.float32)
    tokens = np.asarray(jax.jit(_inverse_cdf)(logits, u))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    cdf = np.cumsum(probs, axis=-1)
    expected = np.minimum((cdf <= (u * cdf[:, -1])[:, None]).sum(-1), (cdf < cdf[:, -1:]).sum(-1))
    # fp32 sums in a different order may move a draw that sits on a boundary by one token; none does here.
    np.testing.assert_array_equal(tokens, expected)
    assert np.isfinite(logits[np.arange(8), tokens]).all()
    # Every uniform lands on a positive-probability token, including u at the very top of the range.
    edge = np.asarray(jax.jit(_inverse_cdf)(logits, np.full(8, np.nextafter(1.0, 0.0), np.float32)))
    assert np.isfinite(logits[np.arange(8), edge]).all()


def test_the_rollout_layout_is_resolved_once_with_its_reason():
    # `auto` on TPU chips (libtpu's devices, nothing compiled) and on this CPU; an explicit layout that
    # places rows itself says so instead of rewriting sharding_style silently.
    import dataclasses

    from jax.sharding import Mesh

    from trainer.model import Qwen2Config
    from trainer.planner import tpu_compile as aot
    from trainer.planner.tpu_specs import parse_accelerator_type
    from trainer.rollout.sharded import resolve_rollout_layout

    config = Qwen2Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2)
    cpu = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("dp", "fsdp", "tp"))
    chosen = resolve_rollout_layout("auto", "legacy", config, cpu)
    assert (chosen.weight_layout, chosen.rows, chosen.configured, chosen.why) == (
        "fsdp", "legacy", "auto", "auto: not on TPU")
    tensor = resolve_rollout_layout("tensor", "legacy", config, cpu)
    assert tensor.rows == "maxtext" and "not sharding_style legacy" in tensor.why
    assert resolve_rollout_layout("replicated", "maxtext", config, cpu).rows == "maxtext"
    with pytest.raises(ValueError, match="use auto or one of"):
        resolve_rollout_layout("sideways", "legacy", config, cpu)
    with pytest.raises(ValueError, match="weight_copies=2 is for weight_layout head_groups, not fsdp"):
        resolve_rollout_layout("fsdp", "legacy", config, cpu, copies=2)
    # `auto` choosing another layout (a TPU config run on CPU) leaves the copies unused and says so.
    on_cpu = resolve_rollout_layout("auto", "legacy", config, cpu, copies=2)
    assert (on_cpu.weight_layout, on_cpu.copies) == ("fsdp", 1)
    assert on_cpu.why == "auto: not on TPU; rollout.weight_copies=2 not used (it is for head_groups)"
    if aot.libtpu_version() is None:
        return
    chips = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-4"))).reshape(1, 4, 1),
                 ("dp", "fsdp", "tp"))
    assert resolve_rollout_layout("auto", "legacy", config, chips).to_json() == {
        "weight_layout": "head_groups", "rows": "legacy", "configured": "auto",
        "why": "auto: the 2 KV heads and the model's dims divide 4 chips", "copies": 1}
    two_copies = resolve_rollout_layout("head_groups", "legacy", config, chips, copies=2)
    assert two_copies.copies == 2 and two_copies.why.endswith("2 copies of the weights, 2 chips each")
    with pytest.raises(ValueError, match="weight_copies=4 does not give each copy.*use a divisor of 2"):
        resolve_rollout_layout("head_groups", "legacy", config, chips, copies=4)
    three_kv = dataclasses.replace(config, num_attention_heads=6, num_key_value_heads=3)
    assert resolve_rollout_layout("auto", "legacy", three_kv, chips).weight_layout == "megatron"
    odd_vocab = dataclasses.replace(config, vocab_size=1026)
    assert resolve_rollout_layout("auto", "legacy", odd_vocab, chips).why == (
        "auto: 4 chips do not divide the vocabulary")
    assert resolve_rollout_layout("auto", "maxtext", config, chips).weight_layout == "fsdp"
    assert resolve_rollout_layout("auto", "legacy", config, chips, mesh_shape="1,4,1").weight_layout == "fsdp"
    # One copy of head_groups' weights per 8 chips: v6e-16 holds two, v6e-8 one.
    v6e16 = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-16"))).reshape(1, 16, 1),
                 ("dp", "fsdp", "tp"))
    sixteen = resolve_rollout_layout("auto", "legacy", config, v6e16)
    assert (sixteen.weight_layout, sixteen.copies) == ("head_groups", 2)
    assert sixteen.why.endswith("2 copies of the weights, 8 chips each (one per 8 chips)")
    assert resolve_rollout_layout("head_groups", "legacy", config, v6e16).copies == 2  # copies auto
    assert resolve_rollout_layout("auto", "legacy", config, v6e16, copies=1).copies == 1
    eight = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-8"))).reshape(1, 8, 1),
                 ("dp", "fsdp", "tp"))
    assert resolve_rollout_layout("auto", "legacy", config, eight).copies == 1
    # Two slices (Multislice, dp over them): a copy on each slice, so decode stays inside a slice; where no
    # copy fits a slice's chips, fsdp (megatron would split the weights over both).
    two = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-4"), 2)).reshape(2, 4, 1),
               ("dp", "fsdp", "tp"))
    both = resolve_rollout_layout("auto", "legacy", config, two)
    assert (both.weight_layout, both.copies) == ("head_groups", 2)
    assert both.why.endswith("2 copies of the weights, 4 chips each (one per 4 chips, 1 a slice)")
    three_kv_on_two = resolve_rollout_layout("auto", "legacy", three_kv, two)
    assert three_kv_on_two.weight_layout == "fsdp" and three_kv_on_two.why.startswith("auto: 2 slices")
