"""The rollout's Sampler (trainer/rollout/sampler.py): padding, end tokens, log-prob consistency, compile
counting, rows on a mesh."""

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

from trainer.rollout.sampler import Sampler

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20]]


def _sampler(tiny_model, **kwargs) -> Sampler:
    model, config = tiny_model
    options = {"buckets": (8, 16), "max_new_tokens": 12} | kwargs
    return Sampler(model, pad_id=0, eos_ids=config.eos_token_ids, **options)

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
