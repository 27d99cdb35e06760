"""GRPO math and the jitted update: advantages, per-token log-probs, the clipped surrogate with KL, and an
optimizer step with micro-batch gradient accumulation.

Sequences are `[prompt | completion]` with prompts left-padded to a fixed length P: the logits at position
t predict token t+1, so the completion's log-probs come from the logits at positions P-1 .. P+C-2.

The model enters only as `token_stats_fn(params, extra, input_ids, positions, attention_mask, targets,
temperature) -> (logp, entropy)`, each [B, C] for the C completion tokens, which lets the math be tested
with any small network (`stats_from_logits` adapts one that returns logits). `params` are the trainable
leaves (what the optimizer sees), `extra` the rest of the model's state (passed through, no gradients).
For a large vocabulary, `chunked_token_stats` computes them a chunk of positions at a time and recomputes
each chunk's logits in the backward pass, so no [B, C, V] fp32 tensor ever exists.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding

LogitsFn = Callable[[Any, Any, jax.Array, jax.Array, jax.Array], jax.Array]
TokenStatsFn = Callable[[Any, Any, jax.Array, jax.Array, jax.Array, jax.Array, float],
                        tuple[jax.Array, jax.Array]]


# --------------------------------------------------------------------------------------------------------
# Advantages


def group_advantages(rewards: Any, group_size: int, eps: float = 1e-4) -> Any:
    """(r - group mean) / (group std + eps) for rows laid out as consecutive groups of `group_size`.

    Works on NumPy and JAX arrays alike. The std is the population std (ddof=0); a group where every
    sample got the same reward has advantage 0 everywhere (nothing to learn from it).
    """
    xp = jnp if isinstance(rewards, jax.Array) else np
    if rewards.shape[0] % group_size:
        raise ValueError(f"{rewards.shape[0]} rewards do not form groups of {group_size}")
    grouped = rewards.reshape(-1, group_size)
    mean = grouped.mean(axis=1, keepdims=True)
    std = grouped.std(axis=1, keepdims=True)
    return ((grouped - mean) / (std + eps)).reshape(rewards.shape).astype(xp.float32)


# --------------------------------------------------------------------------------------------------------
# Log-probs and the loss


def positions_from_mask(attention_mask: jax.Array) -> jax.Array:
    """Token positions that skip left padding: 0 at the first real token."""
    return jnp.maximum(jnp.cumsum(attention_mask, axis=-1) - 1, 0).astype(jnp.int32)


def completion_logprobs(logits: jax.Array, completion_ids: jax.Array,
                        temperature: float) -> tuple[jax.Array, jax.Array]:
    """Log-prob of each completion token and the entropy of the distribution it was drawn from, [B, C].

    `logits` [B, C, V] are the ones predicting `completion_ids` [B, C]. They are divided by the sampling
    temperature so the ratio compares the distribution actually sampled.
    """
    scaled = logits.astype(jnp.float32) / temperature
    targets = completion_ids
    logp_all = jax.nn.log_softmax(scaled, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def chunked_token_stats(hidden: jax.Array, head: Callable[[jax.Array], jax.Array], targets: jax.Array,
                        temperature: float, chunk: int) -> tuple[jax.Array, jax.Array]:
    """`completion_logprobs(head(hidden), targets)` a chunk of `chunk` positions at a time.

    hidden [B, C, D] are the states whose logits predict targets [B, C]; `head` maps [B, c, D] -> [B, c, V].
    Each chunk is rematerialised: the backward pass recomputes its logits instead of keeping them, so the
    largest logits tensor alive is [B, chunk, V]. chunk <= 0 or >= C: one chunk (the plain computation).
    """
    length = hidden.shape[1]
    if chunk <= 0 or chunk >= length:
        return completion_logprobs(head(hidden), targets, temperature)
    count = -(-length // chunk)
    pad = count * chunk - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [B, count*chunk, ...] -> [count, B, chunk, ...]: lax.map runs the chunks one after another.
    h_chunks = hidden.reshape(hidden.shape[0], count, chunk, -1).swapaxes(0, 1)
    t_chunks = targets.reshape(targets.shape[0], count, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one(args: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        h, t = args
        return completion_logprobs(head(h), t, temperature)

    logp, entropy = jax.lax.map(one, (h_chunks, t_chunks))
    def unchunk(x: jax.Array) -> jax.Array:
        return x.swapaxes(0, 1).reshape(x.shape[1], count * chunk)[:, :length]

    return unchunk(logp), unchunk(entropy)


def stats_from_logits(logits_fn: LogitsFn) -> TokenStatsFn:
    """A token_stats_fn from a network that returns the completion positions' logits [B, C, V]."""

    def token_stats(params: Any, extra: Any, ids: jax.Array, positions: jax.Array, mask: jax.Array,
                    targets: jax.Array, temperature: float) -> tuple[jax.Array, jax.Array]:
        return completion_logprobs(logits_fn(params, extra, ids, positions, mask), targets, temperature)

    return token_stats


@dataclass(frozen=True)
class LossSettings:
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0


def grpo_token_terms(logp: jax.Array, old_logp: jax.Array, ref_logp: jax.Array | None,
                     advantages: jax.Array, s: LossSettings) -> dict[str, jax.Array]:
    """Per-token loss (to be averaged over valid tokens), KL and clip indicator, each [B, C].

    loss = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A) + beta * KL(pi || ref), with the
    k3 estimator KL = exp(ref - logp) - (ref - logp) - 1 (non-negative, unbiased).
    """
    adv = advantages[:, None]
    ratio = jnp.exp(logp - old_logp)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - s.epsilon_low, 1.0 + s.epsilon_high) * adv
    loss = -jnp.minimum(unclipped, clipped)
    is_clipped = (clipped < unclipped).astype(jnp.float32)
    if ref_logp is not None and s.beta > 0:
        delta = ref_logp - logp
        kl = jnp.exp(delta) - delta - 1.0
        loss = loss + s.beta * kl
    else:
        kl = jnp.zeros_like(logp)
    return {"loss": loss, "kl": kl, "clipped": is_clipped}


# --------------------------------------------------------------------------------------------------------
# Optimizer


def make_schedule(learning_rate: float, kind: str, total_updates: int, warmup: int,
                  min_lr_ratio: float) -> optax.Schedule:
    if kind == "constant":
        return optax.constant_schedule(learning_rate)
    if kind == "warmup_cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=learning_rate, warmup_steps=warmup,
            decay_steps=max(total_updates, warmup + 1), end_value=learning_rate * min_lr_ratio)
    raise ValueError(f"train.lr_schedule: unknown schedule {kind!r}")


def make_optimizer(name: str, schedule: optax.Schedule, *, clip_norm: float, weight_decay: float,
                   b1: float, b2: float) -> optax.GradientTransformation:
    if name == "adamw":
        core = optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay)
    elif name == "lion":
        core = optax.lion(schedule, b1=b1, b2=b2, weight_decay=weight_decay)
    else:
        raise ValueError(f"train.optimizer: unknown optimizer {name!r}")
    return optax.chain(optax.clip_by_global_norm(clip_norm), core) if clip_norm > 0 else core


# --------------------------------------------------------------------------------------------------------
# The jitted pieces


def _split_micro(x: jax.Array, micro_batches: int) -> jax.Array:
    """[B, ...] -> [M, B/M, ...] taking every M-th row, so each micro-batch stays spread over all devices."""
    b = x.shape[0]
    return x.reshape(b // micro_batches, micro_batches, *x.shape[1:]).swapaxes(0, 1)


@dataclass
class GRPOStep:
    """Builds the jitted log-prob pass and update step for one model and optimizer.

    batch (all [B, ...], B = global sequences): input_ids [B, P+C], attention_mask [B, P+C],
    completion_mask [B, C] (1 = valid completion token), advantages [B], and optionally old_logprobs /
    ref_logprobs [B, C].
    """

    token_stats_fn: TokenStatsFn
    optimizer: optax.GradientTransformation
    prompt_len: int
    temperature: float
    micro_batches: int
    loss: LossSettings
    batch_sharding: NamedSharding | None = None  # sharding of one micro-batch's rows
    # Shardings of params and optimizer state: pinning the outputs to them means step 2 reuses step 1's
    # compilation instead of recompiling for an equivalent-but-different layout XLA picked.
    state_shardings: tuple[Any, Any] | None = None

    def __post_init__(self) -> None:
        self.logprobs = jax.jit(self._logprobs)
        out = None if self.state_shardings is None else (*self.state_shardings, None)
        self.update = jax.jit(self._update, donate_argnums=(0, 2), out_shardings=out)

    def _constrain(self, tree: Any) -> Any:
        if self.batch_sharding is None:
            return tree
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self.batch_sharding), tree)

    def _forward_logprobs(self, params: Any, extra: Any, mb: dict) -> tuple[jax.Array, jax.Array]:
        positions = positions_from_mask(mb["attention_mask"])
        return self.token_stats_fn(params, extra, mb["input_ids"], positions, mb["attention_mask"],
                                   mb["input_ids"][:, self.prompt_len:], self.temperature)

    def _logprobs(self, params: Any, extra: Any, batch: dict) -> jax.Array:
        """Log-probs of the completion tokens under `params` (old policy or reference), [B, C]."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
        micro = jax.tree.map(lambda x: _split_micro(x, self.micro_batches), inputs)

        # The weights ride along as the (unchanged) carry rather than being closed over: a model that wraps
        # its blocks in a lifted transform (nnx.remat) must see them as values of the scan's own trace.
        def body(weights: tuple, mb: dict) -> tuple[tuple, jax.Array]:
            logp, _ = self._forward_logprobs(*weights, self._constrain(mb))
            return weights, logp

        _, logp = jax.lax.scan(body, (params, extra), micro)
        return logp.swapaxes(0, 1).reshape(batch["input_ids"].shape[0], -1)

    def _update(self, params: Any, extra: Any, opt_state: Any, batch: dict) -> tuple[Any, Any, dict]:
        total_tokens = jnp.maximum(batch["completion_mask"].sum(), 1.0)
        micro = jax.tree.map(lambda x: _split_micro(x, self.micro_batches), batch)

        def loss_fn(p: Any, extra_: Any, mb: dict) -> tuple[jax.Array, dict]:
            logp, entropy = self._forward_logprobs(p, extra_, mb)
            old = mb["old_logprobs"] if "old_logprobs" in mb else jax.lax.stop_gradient(logp)
            terms = grpo_token_terms(logp, old, mb.get("ref_logprobs"), mb["advantages"], self.loss)
            mask = mb["completion_mask"]
            # Sums over this micro-batch divided by the whole batch's valid tokens: accumulating the
            # gradients of these gives exactly the gradient of the token-level mean over the full batch.
            sums = {k: jnp.sum(v * mask) / total_tokens for k, v in terms.items()}
            sums["entropy"] = jnp.sum(entropy * mask) / total_tokens
            return sums["loss"], sums

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

        def body(carry: tuple, mb: dict) -> tuple[tuple, None]:
            # weights as carry: see _logprobs. The barrier keeps micro-batches one after another even where
            # XLA unrolls the loop: the next one starts from the previous one's finished gradients, so only
            # one micro-batch's activations are ever alive (the point of micro-batching).
            grads, stats, weights, extra_ = jax.lax.optimization_barrier(carry)
            (_, mb_stats), mb_grads = grad_fn(weights, extra_, self._constrain(mb))
            grads = jax.tree.map(jnp.add, grads, mb_grads)
            stats = jax.tree.map(jnp.add, stats, mb_stats)
            return (grads, stats, weights, extra_), None

        zero_stats = {k: jnp.zeros((), jnp.float32) for k in ("loss", "kl", "clipped", "entropy")}
        zero_grads = jax.tree.map(jnp.zeros_like, params)
        (grads, stats, _, _), _ = jax.lax.scan(body, (zero_grads, zero_stats, params, extra), micro)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {"loss": stats["loss"], "kl": stats["kl"], "clip_fraction": stats["clipped"],
                   "entropy": stats["entropy"], "grad_norm": optax.tree.norm(grads)}
        return params, opt_state, metrics
