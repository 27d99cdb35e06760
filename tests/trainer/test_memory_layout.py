"""What keeps the trainer inside a TPU chip's memory: log-probs computed a chunk of positions at a time (equal
to the plain computation, gradients included), and the optimizer state laid out like the parameters."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.grpo import chunked_token_stats, completion_logprobs


def _head_problem(seed: int = 0, rows: int = 3, length: int = 11, dim: int = 16, vocab: int = 37):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.normal(size=(rows, length, dim)), jnp.float32)
    weight = jnp.asarray(rng.normal(size=(vocab, dim)) * 0.5, jnp.float32)
    targets = jnp.asarray(rng.integers(0, vocab, size=(rows, length)), jnp.int32)
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [1, 4, 5, 11, 0])
def test_chunked_log_probs_and_entropy_equal_the_plain_ones(chunk):
    # 11 positions in chunks of 4 leaves a padded last chunk; 0 and 11 are the one-chunk path.
    hidden, weight, targets = _head_problem()
    head = lambda h: jnp.einsum("...d,vd->...v", h, weight)  # noqa: E731
    logp, entropy = completion_logprobs(head(hidden), targets, temperature=0.7)
    chunked_logp, chunked_entropy = jax.jit(lambda h: chunked_token_stats(h, head, targets, 0.7, chunk))(
        hidden
    )
    assert chunked_logp.shape == logp.shape == targets.shape
    np.testing.assert_allclose(chunked_logp, logp, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(chunked_entropy, entropy, atol=1e-6, rtol=1e-6)


def test_chunked_log_probs_have_the_plain_gradients():
    hidden, weight, targets = _head_problem(seed=1)
    mask = jnp.asarray(np.random.default_rng(2).uniform(size=targets.shape) < 0.8, jnp.float32)

    def loss(h, w, chunk):
        head = lambda x: jnp.einsum("...d,vd->...v", x, w)  # noqa: E731
        if chunk:
            logp, entropy = chunked_token_stats(h, head, targets, 0.9, chunk)
        else:
            logp, entropy = completion_logprobs(head(h), targets, 0.9)
        return jnp.sum((logp + 0.1 * entropy) * mask)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    plain_h, plain_w = grads(hidden, weight, 0)
    chunked_h, chunked_w = grads(hidden, weight, 3)
    np.testing.assert_allclose(chunked_h, plain_h, atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(chunked_w, plain_w, atol=1e-6, rtol=1e-5)


def test_chunked_backward_keeps_no_full_logits():
    """The compiled gradient holds at most a chunk's logits: its temporaries stay far below one fp32
    [rows, length, vocab] tensor, which the plain computation keeps for the backward pass."""
    rows, length, dim, vocab = 2, 1024, 32, 4096
    hidden = jax.ShapeDtypeStruct((rows, length, dim), jnp.float32)
    weight = jax.ShapeDtypeStruct((vocab, dim), jnp.float32)
    targets = jnp.zeros((rows, length), jnp.int32)

    def temp_bytes(chunk):
        def loss(h, w):
            head = lambda x: jnp.einsum("...d,vd->...v", x, w)  # noqa: E731
            return jnp.sum(chunked_token_stats(h, head, targets, 1.0, chunk)[0])

        return (
            jax.jit(jax.grad(loss, argnums=(0, 1)))
            .lower(hidden, weight)
            .compile()
            .memory_analysis()
            .temp_size_in_bytes
        )

    full_logits = rows * length * vocab * 4
    assert temp_bytes(0) >= full_logits
    assert temp_bytes(16) < full_logits / 8


def test_a_real_trainers_optimizer_state_is_sharded_like_its_parameters(tiny_model_dir, tmp_path):
    """On a 4-device mesh (fsdp=4) each device holds 1/4 of AdamW's moments, as of the parameters; before,
    `jit(optimizer.init)` left them whole on every device."""
    script = textwrap.dedent(f"""
        import jax, numpy as np
        from trainer import telemetry as tm
        from trainer.config import load_config
        from trainer.mesh import make_mesh
        from trainer.synthetic_gsm8k import write_jsonl
        from trainer.train import Topology, Trainer
        data = write_jsonl({str(tmp_path / "gsm8k.jsonl")!r}, 16, 0)
        cfg = load_config(raw={{"model_path": {str(tiny_model_dir)!r}, "steps": 1,
                               "data": {{"path": str(data)}},
                               "rollout": {{"batch_size": 2, "n": 2, "global_length": 64,
                                            "max_length_sample": 8}}}})
        mesh = make_mesh("auto")
        trainer = Trainer(cfg, mesh, Topology(0, 1, 4, 4), tm.EventLog(None, 0), tm.CompileCounter(), None)
        device = jax.devices()[0]
        def on_device(tree):
            return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
                       if s.device == device)
        total = sum(x.nbytes for x in jax.tree.leaves(trainer.params))
        params, moments = on_device(trainer.params), on_device(trainer.opt_state) - 64  # minus step counts
        print(total, params, moments)
        assert params <= total / 4 * 1.05, (params, total)
        assert abs(moments - 2 * params) <= 64, (moments, params)
        print("ok")
    """)
    env = os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr[-3000:]
