"""One token a row drawn from logits: greedy, or from softmax(logits / temperature) after top-k / top-p.

Every draw takes one uniform in [0, 1) per row and returns the first token whose cumulative probability
exceeds it (the inverse CDF), so the sampler draws every step's uniforms before its loop and a split
vocabulary (split_sampling.py) can make the same draw. Log-probs are those of the sampled token under
softmax(logits / temperature), before top-k/top-p truncation (greedy: temperature 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# top-p without top-k looks for the nucleus among this many best tokens first; only when their probability
# mass is below top_p for some row does a step fall back to sorting the whole vocabulary.
TOP_P_CANDIDATES = 256


def _first_argmax(x: jax.Array) -> jax.Array:
    """argmax over the last axis (first index of the maximum) as two plain reductions: XLA CPU's variadic
    argmax reduction is several times slower."""
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    best = jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x == best, iota, x.shape[-1]), axis=-1)


# Above this many candidates, the inverse CDF is taken in two levels (blocks, then within the chosen block):
# XLA CPU's cumsum over a whole vocabulary row costs more than the rest of a decode step's sampling.
INVERSE_CDF_BLOCK = 128


def _pick(cdf: jax.Array, target: jax.Array) -> jax.Array:
    """First index whose cumulative mass exceeds target [B] in cdf [B, C]; rounding that puts target at or
    past the total stops at the first index reaching the total (which has positive probability)."""
    index = jnp.sum((cdf <= target[:, None]).astype(jnp.int32), axis=-1)
    return jnp.minimum(index, jnp.sum((cdf < cdf[:, -1:]).astype(jnp.int32), axis=-1))


def _inverse_cdf(scores: jax.Array, uniform: jax.Array) -> jax.Array:
    """Index drawn from softmax(scores) [B, C] with one uniform in [0, 1) per row. -inf scores have zero
    probability."""
    return _draw(jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True)), uniform)


def _draw(probs: jax.Array, uniform: jax.Array) -> jax.Array:
    """Index drawn from unnormalised probabilities [B, C] with one uniform in [0, 1) per row: the first
    index whose cumulative mass exceeds u * total. Exact sampling up to fp32 rounding of the cumulative
    sums, and far cheaper on CPU than Gumbel noise for every candidate."""
    batch, count = probs.shape
    if count <= 2 * INVERSE_CDF_BLOCK:
        cdf = jnp.cumsum(probs, axis=-1)
        return _pick(cdf, uniform * cdf[:, -1])
    # Two levels: pick a block by its mass, then an index inside it with the mass left over.
    blocks = -(-count // INVERSE_CDF_BLOCK)
    probs = jnp.pad(probs, ((0, 0), (0, blocks * INVERSE_CDF_BLOCK - count)))
    probs = probs.reshape(batch, blocks, INVERSE_CDF_BLOCK)
    block_mass = jnp.sum(probs, axis=-1)
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    target = uniform * block_cdf[:, -1]
    block = _pick(block_cdf, target)
    mass_before = jnp.take_along_axis(block_cdf - block_mass, block[:, None], axis=-1)[:, 0]
    inside = jnp.take_along_axis(probs, block[:, None, None], axis=1)[:, 0]
    # Clamped at 0 so that rounding below the block's start still lands on its first positive-mass index.
    index = _pick(jnp.cumsum(inside, axis=-1), jnp.maximum(target - mass_before, 0.0))
    return block * INVERSE_CDF_BLOCK + index


def _nucleus(values: jax.Array, top_p: jax.Array, lse: jax.Array | None = None) -> jax.Array:
    """Scores sorted descending [B, C] with everything past the smallest prefix reaching top_p set to -inf.

    Probabilities are softmax(values) (renormalised over the candidates, as after a top-k filter), or
    exp(values - lse) with the full vocabulary's log-sum-exp when the candidates only bound the search."""
    probs = jax.nn.softmax(values, axis=-1) if lse is None else jnp.exp(values - lse[:, None])
    keep = (jnp.cumsum(probs, axis=-1) - probs) < top_p
    return jnp.where(keep, values, -jnp.inf)


def sample_with_uniform(logits: jax.Array, uniform: jax.Array, temperature: jax.Array, top_p: jax.Array, *,
                        top_k: int, use_top_p: bool, greedy: bool) -> tuple[jax.Array, jax.Array]:
    """Next tokens [B] and their log-probs [B] given one uniform [B] in [0, 1) per row (see sample_logits)."""
    scaled = logits if greedy else logits / temperature
    # One exp over the vocabulary serves the log-probs and an untruncated draw (logits are finite).
    top = jnp.max(scaled, axis=-1, keepdims=True)
    probs = jnp.exp(scaled - top)
    lse = top[:, 0] + jnp.log(jnp.sum(probs, axis=-1))
    if greedy:
        tokens = _first_argmax(logits)
    elif top_k > 0 or use_top_p:
        vocab = scaled.shape[-1]
        if top_k > 0:
            values, indices = jax.lax.top_k(scaled, min(top_k, vocab))
            if use_top_p:
                values = _nucleus(values, top_p)
            choice = _inverse_cdf(values, uniform)
            tokens = jnp.take_along_axis(indices, choice[:, None], axis=-1)[:, 0]
        else:
            # Nucleus among the best TOP_P_CANDIDATES tokens when they hold top_p of the (full-softmax) mass
            # in every row, the usual case; otherwise sort the whole vocabulary. Same draw either way.
            def nucleus_token(candidates: tuple[jax.Array, jax.Array]) -> jax.Array:
                values, indices = candidates
                choice = _inverse_cdf(_nucleus(values, top_p, lse), uniform)
                return jnp.take_along_axis(indices, choice[:, None], axis=-1)[:, 0]

            candidates = jax.lax.top_k(scaled, min(TOP_P_CANDIDATES, vocab))
            if candidates[0].shape[-1] == vocab:
                tokens = nucleus_token(candidates)
            else:
                enough = jnp.all(jnp.sum(jnp.exp(candidates[0] - lse[:, None]), axis=-1) >= top_p)
                tokens = jax.lax.cond(enough, nucleus_token,
                                      lambda _: nucleus_token(jax.lax.top_k(scaled, vocab)), candidates)
    else:
        tokens = _draw(probs, uniform)
    tokens = tokens.astype(jnp.int32)
    return tokens, jnp.take_along_axis(scaled, tokens[:, None], axis=-1)[:, 0] - lse


def sample_logits(logits: jax.Array, rng: jax.Array, temperature: jax.Array, top_p: jax.Array, *,
                  top_k: int, use_top_p: bool, greedy: bool) -> tuple[jax.Array, jax.Array]:
    """Next tokens [B] and their log-probs [B] (under softmax(logits / temperature), untruncated)."""
    uniform = jax.random.uniform(rng, logits.shape[:1], jnp.float32)
    return sample_with_uniform(logits, uniform, temperature, top_p, top_k=top_k, use_top_p=use_top_p,
                               greedy=greedy)
