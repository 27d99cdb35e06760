"""Sampling from logits whose vocabulary is split over devices, without gathering the logits.

A decode step of the `megatron` and `head_groups` rollout layouts (decode_layouts.py) computes
each chip's slice of the vocabulary for every row, from the whole final hidden state and the chip's slice
of the head (split by vocabulary). Gathering those logits to their rows' chips would move 39 MB a token for
128 rows of Qwen2.5, so the draw is made where the logits are: every chip shares its slice's max and
exp-sum per row (and its rows' uniforms) in one small all-gather, from which every chip computes the same
log-sum-exp and the same choice of slice for each row; the chip holding it draws inside its slice, and
one small all-reduce brings the tokens and their log-probs to their rows' chips.

The draw is `sampling.sample_with_uniform`'s: the first token whose cumulative probability exceeds the
row's uniform, here taken by slice first, then inside the slice as `sampling._draw` takes it (by blocks of
128 tokens, then a token, for a slice of more than 256). Greedy picks the first maximum, and needs only the
all-gather: it carries each slice's first maximal token. Top-k and top-p need the whole row sorted, so they
gather the logits to their rows (an all-to-all) and sample there as the plain path does.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from trainer.model import rms_norm
from trainer.rollout.sampling import _draw, _first_argmax, sample_with_uniform


def sample_split_vocab(mesh: Mesh, axes: tuple, x: jax.Array, norm: Any, weight: jax.Array, vocab_major: bool,
                       uniform: jax.Array, temperature: jax.Array, top_p: jax.Array, *, top_k: int,
                       use_top_p: bool, greedy: bool, copy_axes: tuple = ()) -> tuple[jax.Array, jax.Array]:
    """Next tokens [B] and their log-probs [B], rows split over (`copy_axes`, `axes`), from the final hidden
    states x [B, hidden] (split over `copy_axes`, whole on the devices of `axes`), the final norm, and the
    head's weight split by vocabulary over `axes` ([vocab, hidden] when vocab_major), whole over
    `copy_axes`. uniform [B]: one uniform per row, rows as the result's. `copy_axes` (none: `axes` is every
    device) are the axes of a layout's copies of the weights, each copy sampling its own rows alone. Same
    tokens as sample_with_uniform on the whole logits, up to fp32 rounding of the cumulative sums."""
    n = int(np.prod([mesh.shape[a] for a in axes]))
    compute = weight.dtype
    pattern = "bd,vd->bv" if vocab_major else "bd,dv->bv"

    def local(x: jax.Array, scale: jax.Array, weight: jax.Array, uniform: jax.Array, temperature: jax.Array,
              top_p: jax.Array) -> tuple[jax.Array, jax.Array]:
        a = rms_norm(x, scale, norm.eps, compute)
        # The whole contraction is on this chip: fp32 logits without partial sums.
        logits = jnp.einsum(pattern, a, weight.astype(compute), preferred_element_type=jnp.float32)
        if top_k > 0 or use_top_p:
            rows = jax.lax.all_to_all(logits, axes, 0, 1, tiled=True)  # [B / n, vocab]
            return sample_with_uniform(rows, uniform, temperature, top_p, top_k=top_k, use_top_p=use_top_p,
                                       greedy=greedy)
        width = logits.shape[-1]
        first = jax.lax.axis_index(axes) * width  # this chip's first token id
        scaled = logits if greedy else logits / temperature
        top = jnp.max(scaled, axis=-1)
        # A slice masked whole (-inf) has no mass: exp against 0, not against its -inf maximum (NaN).
        probs = jnp.exp(scaled - jnp.where(jnp.isfinite(top), top, 0.0)[:, None])
        if greedy:
            third = (first + _first_argmax(scaled)).astype(jnp.float32)  # exact below 2^24 tokens
        else:  # this chip's rows' uniforms, zero at the other rows: summed over chips, every row's
            third = jax.lax.dynamic_update_slice_in_dim(jnp.zeros(x.shape[:1], jnp.float32), uniform,
                                                        jax.lax.axis_index(axes) * uniform.shape[0], axis=0)
        # One all-gather of [devices, 3, B]: each slice's max and exp-sum per row, and the third row.
        stats = jax.lax.all_gather(jnp.stack([top, jnp.sum(probs, axis=-1), third]), axes)
        tops, sums = stats[:, 0], stats[:, 1]
        best = jnp.max(tops, axis=0)
        mass = sums * jnp.exp(tops - best)  # each slice's probability mass, unnormalised [devices, B]
        total = jnp.sum(mass, axis=0)
        lse = best + jnp.log(total)
        if greedy:
            # The first slice holding the maximum has the first maximal token (token ids grow with slices).
            chosen = jnp.argmax(tops == best, axis=0)
            tokens = jnp.take_along_axis(stats[:, 2], chosen[None], axis=0)[0].astype(jnp.int32)
            return own_rows(tokens, axes, n), own_rows(best - lse, axes, n)
        # The slice holding each row's draw: the first whose cumulative mass exceeds u * total (rounding past
        # the total stops at the last slice with any mass). Every chip computes the same choice.
        cumulative = jnp.cumsum(mass, axis=0)
        target = jnp.sum(stats[:, 2], axis=0) * total
        index = jnp.arange(n)[:, None]
        last = jnp.max(jnp.where(mass > 0, index, 0), axis=0)
        chosen = jnp.minimum(jnp.sum((cumulative <= target).astype(jnp.int32), axis=0), last)
        before = jnp.sum(jnp.where(index < chosen, mass, 0.0), axis=0)
        mine = chosen == jax.lax.axis_index(axes)
        own_mass = jnp.take_along_axis(mass, chosen[None], axis=0)[0]
        inside = jnp.clip((target - before) / own_mass, 0.0, jnp.nextafter(jnp.float32(1), jnp.float32(0)))
        pick = _draw(probs, inside)
        logprob = jnp.take_along_axis(scaled, pick[:, None], axis=-1)[:, 0] - lse
        # Tokens (as fp32, exact) and log-probs from the chips that drew them, zero elsewhere: one all-reduce.
        drawn = jax.lax.psum(jnp.where(mine, jnp.stack([(first + pick).astype(jnp.float32), logprob]), 0.0),
                             axes)
        return own_rows(drawn[0].astype(jnp.int32), axes, n), own_rows(drawn[1], axes, n)

    rows, whole = PartitionSpec((*copy_axes, *axes)), PartitionSpec()
    per_copy = PartitionSpec(copy_axes or None)
    head = PartitionSpec(axes, None) if vocab_major else PartitionSpec(None, axes)
    return jax.shard_map(local, mesh=mesh, in_specs=(per_copy, whole, head, rows, whole, whole),
                         out_specs=(rows, rows))(x, norm.scale[...], weight, uniform, temperature, top_p)


def own_rows(y: jax.Array, axes: Any, parts: int) -> jax.Array:
    """This device's block of y's rows, split into `parts` blocks over `axes` (inside a shard_map)."""
    size = y.shape[0] // parts
    return jax.lax.dynamic_slice_in_dim(y, jax.lax.axis_index(axes) * size, size, axis=0)
