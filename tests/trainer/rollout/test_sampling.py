"""One token a row drawn from logits (trainer/rollout/sampling.py): greedy, top-k and top-p filters, the
draw's distribution, the two-level inverse CDF, log-probs at the sampling temperature."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.rollout.sampling import (
    INVERSE_CDF_BLOCK,
    TOP_P_CANDIDATES,
    _inverse_cdf,
    sample_logits,
    sample_with_uniform,
)


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
