"""Qwen2 model: config round trips, forward consistency (padding, cache), sharding metadata."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from trainer.model import PRESETS, Qwen2Config, create_model
from trainer.param_sharding import fit_spec, param_shardings

SMALL = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2)


def _positions(mask: np.ndarray) -> np.ndarray:
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


# Jitted entry points: eager op-by-op dispatch is slower than compiling these tiny graphs.
forward = nnx.jit(lambda model, ids, positions, mask: model(ids, positions, mask))
decode = nnx.jit(lambda model, ids, positions, kv_mask, cache, index: model.decode(ids, positions, kv_mask,
                                                                                   cache, index))


def test_presets_match_published_qwen25_shapes():
    assert PRESETS["qwen2.5-0.5b"].dim_per_head == 64
    assert Qwen2Config.preset("Qwen2.5-3B-Instruct").num_hidden_layers == 36
    seven = Qwen2Config.preset("qwen2.5-7b")
    assert (seven.vocab_size, seven.num_key_value_heads, seven.tie_word_embeddings) == (152064, 4, False)
    with pytest.raises(ValueError, match="unknown preset"):
        Qwen2Config.preset("llama-7b")


def test_config_hf_round_trip_and_transformers5_rope_layout():
    config = Qwen2Config.preset("qwen2.5-1.5b", eos_token_id=(151645, 151643))
    assert Qwen2Config.from_hf(config.to_hf()) == config
    hf = config.to_hf()
    del hf["rope_theta"]
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 12345.0}
    assert Qwen2Config.from_hf(hf).rope_theta == 12345.0


def test_config_rejects_other_architectures_and_rope_scaling():
    with pytest.raises(ValueError, match="model_type 'llama'"):
        Qwen2Config.from_hf({"model_type": "llama"})
    with pytest.raises(ValueError, match="rope type 'yarn'"):
        Qwen2Config.from_hf({**SMALL.to_hf(), "rope_scaling": {"type": "yarn", "factor": 4.0}})


def test_forward_is_fp32_and_left_padding_does_not_change_real_positions():
    model = create_model(SMALL, compute_dtype=jnp.float32)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, SMALL.vocab_size, (1, 6))
    unpadded = forward(model, jnp.asarray(tokens), jnp.arange(6)[None], jnp.ones((1, 6), jnp.int32))
    padded_ids = np.concatenate([np.full((1, 3), 7), tokens], axis=1)
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    padded = forward(model, jnp.asarray(padded_ids), jnp.asarray(_positions(mask)), jnp.asarray(mask))
    assert padded.dtype == jnp.float32 and padded.shape == (1, 9, SMALL.vocab_size)
    np.testing.assert_allclose(np.asarray(padded[:, 3:]), np.asarray(unpadded), atol=1e-5)


def test_cached_decode_matches_full_forward_token_by_token():
    model = create_model(SMALL, compute_dtype=jnp.float32)
    batch, length = 2, 7
    ids = jnp.asarray(np.random.default_rng(1).integers(0, SMALL.vocab_size, (batch, length)))
    mask = np.ones((batch, length), np.int32)
    mask[0, :2] = 0
    positions = jnp.asarray(_positions(mask))
    full = np.asarray(forward(model, ids, positions, jnp.asarray(mask)))
    # Prefill the first 4 tokens, then one token at a time, into a cache with 2 spare slots.
    cache = model.init_cache(batch, length + 2, jnp.float32)
    kv_mask = np.zeros((batch, length + 2), np.int32)
    kv_mask[:, :4] = mask[:, :4]
    logits, cache = decode(model, ids[:, :4], positions[:, :4], jnp.asarray(kv_mask), cache, 0)
    np.testing.assert_allclose(np.asarray(logits), full[:, 3], atol=1e-5)
    for t in range(4, length):
        kv_mask[:, t] = mask[:, t]
        logits, cache = decode(model, ids[:, t:t + 1], positions[:, t:t + 1], jnp.asarray(kv_mask), cache,
                               jnp.int32(t))
        np.testing.assert_allclose(np.asarray(logits), full[:, t], atol=1e-5)


prefill = nnx.jit(lambda model, ids, positions, mask, length: model.prefill(ids, positions, mask, length),
                  static_argnums=4)


def test_prefill_matches_decode_into_an_empty_cache_and_then_decodes_on():
    model = create_model(SMALL, compute_dtype=jnp.float32)
    batch, length = 3, 6
    ids = jnp.asarray(np.random.default_rng(2).integers(0, SMALL.vocab_size, (batch, length)))
    mask = np.ones((batch, length), np.int32)
    mask[0, :3], mask[2, :5] = 0, 0  # left padding, one row with a single real token
    positions = jnp.asarray(_positions(mask))
    logits, cache = prefill(model, ids, positions, jnp.asarray(mask), length + 3)
    kv_mask = np.concatenate([mask, np.zeros((batch, 3), np.int32)], axis=1)
    expected, expected_cache = decode(model, ids, positions, jnp.asarray(kv_mask),
                                      model.init_cache(batch, length + 3, jnp.float32), 0)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), atol=1e-5)
    for (k, v), (k_ref, v_ref) in zip(cache, expected_cache, strict=True):
        assert k.shape == k_ref.shape == (batch, SMALL.num_key_value_heads, length + 3, SMALL.dim_per_head)
        # Slots of real tokens and the free slots agree; padded slots are masked everywhere, so they may not.
        real = np.concatenate([mask, np.ones((batch, 3), np.int32)], axis=1).astype(bool)
        real = real[:, None].repeat(SMALL.num_key_value_heads, 1)
        np.testing.assert_allclose(np.asarray(k)[real], np.asarray(k_ref)[real], atol=1e-5)
        np.testing.assert_allclose(np.asarray(v)[real], np.asarray(v_ref)[real], atol=1e-5)
    # The next token decodes the same from either cache.
    kv_mask[:, length] = 1
    step = (ids[:, :1], positions[:, -1:] + 1, jnp.asarray(kv_mask))
    np.testing.assert_allclose(np.asarray(decode(model, *step, cache, jnp.int32(length))[0]),
                               np.asarray(decode(model, *step, expected_cache, jnp.int32(length))[0]),
                               atol=1e-5)


def test_bf16_compute_tracks_fp32_and_untied_head_is_used():
    config = dataclasses.replace(SMALL, tie_word_embeddings=False)
    fp32 = create_model(config, compute_dtype=jnp.float32)
    bf16 = create_model(config, compute_dtype=jnp.bfloat16)
    assert fp32.lm_head is not None and fp32.lm_head.kernel.shape == (32, 128)
    ids = jnp.arange(10)[None] % config.vocab_size
    args = (ids, jnp.arange(10)[None], jnp.ones((1, 10), jnp.int32))
    a, b = np.asarray(forward(fp32, *args)), np.asarray(forward(bf16, *args))
    assert b.dtype == np.float32
    assert np.abs(a - b).max() < 0.1 * np.abs(a).max()
    assert bf16.embed_tokens[...].dtype == jnp.float32  # params stay fp32 by default


def test_remat_gives_same_loss_and_gradients():
    plain = create_model(SMALL, compute_dtype=jnp.float32)
    remat = create_model(SMALL, compute_dtype=jnp.float32, remat=True)
    ids = jnp.arange(8)[None]
    args = (ids, jnp.arange(8)[None], jnp.ones((1, 8), jnp.int32))

    def loss(model):
        return jnp.mean(jax.nn.log_softmax(model(*args))[..., 1])

    grad = nnx.jit(nnx.value_and_grad(loss))
    (l1, g1), (l2, g2) = grad(plain), grad(remat)
    np.testing.assert_allclose(l1, l2, rtol=1e-6)
    k1 = g1["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    k2 = g2["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    assert np.abs(k1).max() > 0
    np.testing.assert_allclose(k1, k2, atol=1e-6)


def test_params_carry_mesh_axes_and_fit_spec_drops_what_does_not_divide():
    model = create_model(SMALL)
    spec = nnx.get_partition_spec(nnx.state(model))
    assert spec["layers"][0]["self_attn"]["q_proj"]["kernel"].get_value() == PartitionSpec("fsdp", "tp")
    assert spec["layers"][1]["mlp"]["down_proj"]["kernel"].get_value() == PartitionSpec("tp", "fsdp")
    assert spec["embed_tokens"].get_value() == PartitionSpec("tp", "fsdp")
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("dp", "fsdp", "tp"))
    shardings = param_shardings(model, mesh)
    assert shardings["norm"]["scale"].get_value().mesh.shape == mesh.shape

    fake_mesh = SimpleNamespace(shape={"dp": 1, "fsdp": 4, "tp": 2})  # fit_spec reads only .shape
    assert fit_spec((8, 6), ("fsdp", "tp"), fake_mesh) == PartitionSpec("fsdp", "tp")
    assert fit_spec((6, 7), ("fsdp", "tp"), fake_mesh) == PartitionSpec(None, None)
    kv_spec = fit_spec((16, 5, 3, 8), (("dp", "fsdp"), None, "tp", None), fake_mesh)
    assert kv_spec == PartitionSpec(("dp", "fsdp"), None, None, None)
