"""GRPO math against a NumPy reference: advantages, log-probs, the clipped surrogate with KL, and that the
micro-batched update equals one full-batch step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from trainer.grpo import (
    GRPOStep,
    LossSettings,
    completion_logprobs,
    group_advantages,
    grpo_token_terms,
    make_optimizer,
    make_schedule,
    positions_from_mask,
    stats_from_logits,
)


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def np_reference_loss(logp, old, ref, adv, mask, eps_low, eps_high, beta):
    """Token-level GRPO loss written out element by element."""
    total, kl_total, clipped, count = 0.0, 0.0, 0, 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            ratio = np.exp(logp[b, t] - old[b, t])
            a = adv[b]
            unclipped = ratio * a
            clip = min(max(ratio, 1 - eps_low), 1 + eps_high) * a
            d = ref[b, t] - logp[b, t]
            kl = np.exp(d) - d - 1
            total += -min(unclipped, clip) + beta * kl
            kl_total += kl
            clipped += clip < unclipped
            count += 1
    return total / count, kl_total / count, clipped / count


def test_group_advantages_match_numpy_and_zero_for_flat_groups():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.5, 1.5, 0.0, 3.0], np.float32)
    got = group_advantages(rewards, 4)
    expected = []
    for g in rewards.reshape(3, 4):
        expected.extend((g - g.mean()) / (g.std() + 1e-4))
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-5, atol=1e-6)
    assert np.all(got[4:8] == 0)  # all-equal group: nothing to learn
    np.testing.assert_allclose(np.asarray(group_advantages(jnp.asarray(rewards), 4)), got, rtol=1e-5)
    with pytest.raises(ValueError):
        group_advantages(rewards, 5)


def test_completion_logprobs_and_entropy_match_numpy():
    rng = np.random.default_rng(0)
    b, p, c, v = 3, 4, 5, 7
    logits = rng.normal(size=(b, p + c, v)).astype(np.float32)
    ids = rng.integers(0, v, size=(b, p + c))
    logp, ent = completion_logprobs(
        jnp.asarray(logits[:, p - 1 : -1]), jnp.asarray(ids[:, p:]), temperature=0.7
    )
    ref = np_log_softmax(logits / 0.7)
    for i in range(b):
        for t in range(c):
            # the logit at position p+t-1 predicts the token at p+t
            assert logp[i, t] == pytest.approx(ref[i, p + t - 1, ids[i, p + t]], abs=1e-5)
            assert ent[i, t] == pytest.approx(
                -(np.exp(ref[i, p + t - 1]) * ref[i, p + t - 1]).sum(), abs=1e-5
            )


def test_positions_skip_left_padding():
    mask = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_clipped_surrogate_with_kl_matches_reference(beta):
    rng = np.random.default_rng(1)
    b, c = 4, 6
    logp = rng.normal(-1.0, 0.5, size=(b, c)).astype(np.float32)
    old = logp + rng.normal(0, 0.4, size=(b, c)).astype(np.float32)  # ratios far enough from 1 to clip
    ref = logp + rng.normal(0, 0.3, size=(b, c)).astype(np.float32)
    adv = np.array([1.0, -1.0, 0.5, -2.0], np.float32)
    mask = (rng.random((b, c)) > 0.3).astype(np.float32)
    s = LossSettings(epsilon_low=0.2, epsilon_high=0.28, beta=beta)
    terms = grpo_token_terms(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(ref), jnp.asarray(adv), s)
    n = mask.sum()
    loss = float((terms["loss"] * mask).sum() / n)
    kl = float((terms["kl"] * mask).sum() / n)
    clip = float((terms["clipped"] * mask).sum() / n)
    exp_loss, exp_kl, exp_clip = np_reference_loss(logp, old, ref, adv, mask, 0.2, 0.28, beta)
    assert loss == pytest.approx(exp_loss, rel=1e-5)
    assert clip == pytest.approx(exp_clip)
    assert 0 < clip < 1
    if beta:
        assert kl == pytest.approx(exp_kl, rel=1e-5) and kl > 0
    else:
        assert kl == 0.0


def _toy_model(vocab: int, dim: int, p: int):
    """Embedding + position-free linear head: small enough to check against a hand-written loss."""
    key = jax.random.PRNGKey(0)
    params = {
        "emb": jax.random.normal(key, (vocab, dim)) * 0.5,
        "head": jax.random.normal(jax.random.split(key)[0], (dim, vocab)) * 0.5,
    }

    def apply_fn(pp, extra, ids, positions, mask):
        return (pp["emb"][ids] @ pp["head"])[:, p - 1 : -1]  # the logits that predict the completion

    return params, apply_fn


def _toy_batch(b: int, p: int, c: int, vocab: int):
    rng = np.random.default_rng(2)
    ids = rng.integers(0, vocab, size=(b, p + c)).astype(np.int32)
    attn = np.ones((b, p + c), np.int32)
    attn[0, :2] = 0  # left padding in one prompt
    cmask = (rng.random((b, c)) > 0.2).astype(np.float32)
    attn[:, p:] = cmask.astype(np.int32)
    adv = group_advantages(rng.normal(size=b).astype(np.float32), 4)
    return {
        "input_ids": jnp.asarray(ids),
        "attention_mask": jnp.asarray(attn),
        "completion_mask": jnp.asarray(cmask),
        "advantages": jnp.asarray(adv),
    }


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_update_step_gradient_equals_full_batch_loss_gradient(micro_batches):
    vocab, dim, b, p, c = 11, 8, 8, 3, 4
    params, apply_fn = _toy_model(vocab, dim, p)
    batch = _toy_batch(b, p, c, vocab)
    settings = LossSettings(0.2, 0.28, beta=0.1)
    ref_params = jax.tree.map(lambda x: x + 0.05, params)

    def full_loss(pp):
        ids = batch["input_ids"]
        logp, _ = completion_logprobs(apply_fn(pp, None, ids, None, None), ids[:, p:], 1.0)
        ref_logp, _ = completion_logprobs(apply_fn(ref_params, None, ids, None, None), ids[:, p:], 1.0)
        terms = grpo_token_terms(logp, jax.lax.stop_gradient(logp), ref_logp, batch["advantages"], settings)
        m = batch["completion_mask"]
        return (terms["loss"] * m).sum() / m.sum()

    expected_loss, expected_grads = jax.jit(jax.value_and_grad(full_loss))(
        params
    )  # one compile, not op by op
    sgd = optax.sgd(1.0)
    step = GRPOStep(
        stats_from_logits(apply_fn),
        sgd,
        prompt_len=p,
        temperature=1.0,
        micro_batches=micro_batches,
        loss=settings,
    )
    ref_logp = step.logprobs(ref_params, None, batch)
    new_params, _, metrics = step.update(
        jax.tree.map(jnp.copy, params), None, sgd.init(params), {**batch, "ref_logprobs": ref_logp}
    )
    assert float(metrics["loss"]) == pytest.approx(float(expected_loss), rel=1e-5)
    for k in params:  # sgd(1.0): params - new_params == gradient
        np.testing.assert_allclose(params[k] - new_params[k], expected_grads[k], rtol=1e-4, atol=1e-6)
    assert float(metrics["clip_fraction"]) == 0.0  # first epoch: ratio is exactly 1


def test_ppo_epochs_with_old_logprobs_clip_and_schedules():
    vocab, dim, b, p, c = 11, 8, 8, 3, 4
    params, apply_fn = _toy_model(vocab, dim, p)
    batch = _toy_batch(b, p, c, vocab)
    schedule = make_schedule(0.5, "constant", 3, 0, 0.1)
    tx = make_optimizer("adamw", schedule, clip_norm=1.0, weight_decay=0.0, b1=0.9, b2=0.999)
    step = GRPOStep(
        stats_from_logits(apply_fn), tx, prompt_len=p, temperature=1.0, micro_batches=2, loss=LossSettings()
    )
    old = step.logprobs(params, None, batch)
    state, opt = jax.tree.map(jnp.copy, params), tx.init(params)
    clip_fractions = []
    for _ in range(3):
        state, opt, m = step.update(state, None, opt, {**batch, "old_logprobs": old})
        clip_fractions.append(float(m["clip_fraction"]))
    assert (
        clip_fractions[0] == 0.0 and clip_fractions[-1] > 0
    )  # big lr moves the policy out of the trust region
    cos = make_schedule(1.0, "warmup_cosine", 10, 2, 0.1)
    assert (
        float(cos(0)) == 0.0 and float(cos(2)) == pytest.approx(1.0) and float(cos(10)) == pytest.approx(0.1)
    )
    lion = make_optimizer("lion", schedule, clip_norm=0.0, weight_decay=0.01, b1=0.9, b2=0.99)
    _, _, m = GRPOStep(stats_from_logits(apply_fn), lion, p, 1.0, 1, LossSettings()).update(
        jax.tree.map(jnp.copy, params), None, lion.init(params), batch
    )
    assert np.isfinite(float(m["loss"]))


def test_qwen2_with_remat_through_logprob_pass_and_update(tiny_model_dir):
    """The real model with remat (the config default): the scanned log-prob pass and the update trace, and
    remat changes no numbers."""
    from flax import nnx

    from trainer.programs import completion_token_stats_fn
    from trainer.weights import load_model

    p, c, b = 6, 3, 4
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 200, size=(b, p + c)).astype(np.int32)
    batch = {
        "input_ids": jnp.asarray(ids),
        "attention_mask": jnp.ones((b, p + c), jnp.int32),
        "completion_mask": jnp.ones((b, c), jnp.float32),
        "advantages": jnp.asarray(np.array([1.0, -1.0, 0.5, -0.5], np.float32)),
    }
    logps = []
    for remat in (False, True):
        model, _ = load_model(tiny_model_dir, compute_dtype=jnp.float32, remat=remat)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        tx = optax.adamw(1e-3)
        step = GRPOStep(
            completion_token_stats_fn(graphdef, p, chunk=2),
            tx,
            prompt_len=p,
            temperature=1.0,
            micro_batches=2,
            loss=LossSettings(beta=0.1),
        )
        logp = step.logprobs(params, rest, batch)
        logps.append(np.asarray(logp))
        _, _, metrics = step.update(
            params, rest, tx.init(params), {**batch, "old_logprobs": logp, "ref_logprobs": logp}
        )
        assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
    np.testing.assert_allclose(logps[0], logps[1], rtol=1e-5, atol=1e-6)


def test_rollout_layout_keeps_kv_heads_on_tp_unless_rows_use_it():
    from trainer.model import ShardingRules
    from trainer.rollout.sharded import rollout_axes

    cache = ShardingRules().kv_cache  # [batch, kv_heads, length, head_dim]
    assert rollout_axes(("dp",), cache) == (("dp",), "tp", None, None)  # rows on dp alone: heads stay on tp
    assert rollout_axes(("dp", "fsdp", "tp"), cache) == (("dp", "fsdp", "tp"), None, None, None)  # all
    assert rollout_axes(("dp",), ShardingRules().batch) == (("dp",),)  # [B, N] tokens: rows only
