"""Rollout: batched sampling from a Qwen2ForCausalLM with a preallocated KV cache.

The Sampler owns the cache and the loop; the model only knows one cached forward (`model.decode`).
- Prompts are left-padded to the smallest of a few length buckets, so every row's last prompt token sits in
  the same cache slot and decode writes one slot per step for the whole batch. Positions come from the mask.
- Rows with the same prompt (a GRPO group's samples) share one prefill: each distinct prompt is run once and
  its cache rows copied to its samples (`shared_prompts`).
- Prefill is one jitted forward over the prompts; decode is one jitted program of `lax.while_loop`
  segments that stops when every row has produced an end token (or max_new_tokens).
- Attention reads only the filled part of the cache: the cache grows in length buckets. Prefill's holds the
  prompt bucket + `attend_bucket` new tokens; each later segment's doubles the new tokens (up to
  max_new_tokens, see decode_segments), so a step reads at most twice the slots that can be filled, not
  all `prompt bucket + max_new_tokens` slots every step. A segment starts only while some row is going.
- Compilations happen once per (batch size, bucket, sampling mode); `compile_count` counts them.

Log-probs are those of the sampled token under softmax(logits / temperature), before top-k/top-p truncation
(greedy: temperature 1). A GRPO loss that recomputes log-probs must divide its logits by the same temperature.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from trainer.model import DecodeLayout, Qwen2ForCausalLM, fit_spec, matmul_output


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutBatch:
    prompt_ids: jax.Array  # [B, P] int32, left-padded with pad_id
    prompt_mask: jax.Array  # [B, P] int32, 1 = prompt token
    completion_ids: jax.Array  # [B, N] int32, pad_id after the end token
    completion_mask: jax.Array  # [B, N] int32, 1 up to and including the first end token
    logprobs: jax.Array  # [B, N] float32, 0 where completion_mask is 0


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


def decode_segments(max_new_tokens: int, first: int) -> tuple[int, ...]:
    """The new tokens the cache holds in each decode segment: first, doubling, up to max_new_tokens (always
    the last). first <= 0 or >= max_new_tokens: one segment over the whole cache."""
    if first <= 0 or first >= max_new_tokens:
        return (max_new_tokens,)
    ends = [first]
    while ends[-1] * 2 < max_new_tokens:
        ends.append(ends[-1] * 2)
    return (*ends, max_new_tokens)


class Sampler:
    """Batched sampling from `model` with a preallocated KV cache: `generate` runs `rollout_weights_program`
    (when the weights need a cast), `prefill` and `decode_loop`, jitted once per shape and sampling mode."""

    def __init__(self, model: Qwen2ForCausalLM, pad_id: int, eos_ids: Sequence[int],
                 buckets: Sequence[int] = (64, 128, 256, 512, 1024), max_new_tokens: int = 256,
                 mesh: Mesh | None = None, cache_dtype: Any = None, constrain_rows: bool = True,
                 matmul_dtype: Any = jnp.float32, cache_write_as_bits: bool = True,
                 attend_bucket: int = 128):
        """buckets: the prompt widths prompts are left-padded to (the smallest that fits). mesh: rows split
        over its data axes (None: one device). cache_dtype: the KV cache's (default the compute dtype).
        constrain_rows: pin activations, logits and the cache to their rows' devices (False leaves them to
        the partitioner). matmul_dtype: the weight matmuls' output dtype (their partial sums, where a
        layout all-reduces them). cache_write_as_bits: write a bf16 cache through an integer bitcast (XLA
        CPU otherwise widens the whole cache every token; on TPU it is a copy). ShardedSampler sets the last
        three for its layout. attend_bucket: new tokens the first decode segment's cache holds, doubling each
        segment after (decode_segments); 0: one segment, attention over every `bucket + max_new_tokens` slot
        every step."""
        if not eos_ids:
            raise ValueError("eos_ids is empty; pass the tokenizer's end-of-turn id(s), e.g. <|im_end|>")
        self.model = model
        self.pad_id = int(pad_id)
        self.eos_ids = tuple(int(i) for i in eos_ids)
        self.buckets = tuple(sorted(int(b) for b in buckets))
        self.max_new_tokens = int(max_new_tokens)
        self.attend_bucket = int(attend_bucket)
        self.segments = decode_segments(self.max_new_tokens, self.attend_bucket)
        self.mesh = mesh
        self.constrain_rows = constrain_rows
        self.matmul_dtype = matmul_dtype  # of the weight matmuls' outputs (partial sums): model.matmul_output
        self.cache_write_as_bits = cache_write_as_bits  # model._write_cache: right on CPU, a copy on TPU
        self.roll_layers = True  # a scanned model's layer loop stays a loop (StackedWeightsSampler decides)
        self.cache_dtype = cache_dtype or model.compute_dtype
        self.compile_count = 0  # incremented while tracing, i.e. once per compilation
        self._graphdef = nnx.graphdef(model)
        # Params are cast to the compute dtype once per generate, shared by prefill and decode. Cast inside
        # the decode jit, XLA CPU may fold the cast into the dots and run them in fp32 every step.
        self._cast = jax.jit(self._cast_impl)
        statics = ("top_k", "use_top_p", "greedy")
        # The two programs `generate` runs (the planner compiles these same jitted functions):
        # prefill(state, prompt_ids, prompt_mask, rng, temperature, top_p[, rows], *, top_k, use_top_p,
        #   greedy) -> (cache, kv_mask, first tokens, their log-probs)
        # decode_loop(state, cache, kv_mask, first tokens, their log-probs, prompt_lens, rng, temperature,
        #   top_p, *, top_k, use_top_p, greedy) -> (tokens, completion_mask, logprobs, cache, kv_mask)
        self.prefill = jax.jit(self._under_matmul_output(self._prefill_impl), static_argnames=statics)
        # One segment: the loop updates the donated cache in place and returns it (XLA aliases it). With
        # several, each segment's cache is a new, longer buffer, which no output could take the place of.
        donated = ("cache", "kv_mask") if len(self.segments) == 1 else ()
        self.decode_loop = jax.jit(self._under_matmul_output(self._decode_impl), static_argnames=statics,
                                   donate_argnames=donated)

    # ---- traced functions -------------------------------------------------------------------------------

    def _model(self, state: nnx.State) -> Qwen2ForCausalLM:
        return nnx.merge(self._graphdef, state)

    def _cast_impl(self, state: nnx.State) -> nnx.State:
        dtype = self.model.compute_dtype
        return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)

    def _under_matmul_output(self, fn: Any) -> Any:
        """`fn` traced with the weight matmuls returning `matmul_dtype` (same signature: jit's statics)."""

        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with matmul_output(self.matmul_dtype, cache_write_as_bits=self.cache_write_as_bits,
                               roll_layers=self.roll_layers):
                return fn(*args, **kwargs)

        return traced

    def _rows_layout(self, model: Qwen2ForCausalLM) -> Any:
        """The model's row placement for activations and logits: rows split as the batch is, unless
        `constrain_rows` is off (the partitioner then decides, and may give every device every row)."""
        return self._pinned(model.config.sharding.batch)

    def _cache_layout(self, model: Qwen2ForCausalLM) -> Any:
        """Where each layer's KV cache stays through a decode step: where prefill put it."""
        return self._pinned(model.config.sharding.kv_cache)

    def _decode_layout(self, model: Qwen2ForCausalLM) -> DecodeLayout | None:
        """How a decode step lays out its work (model.DecodeLayout; None: the model's plain code, layouts
        left to the partitioner; overridable)."""
        return None

    def _pinned(self, axes: tuple) -> Any:
        """A layout hook constraining an array to `axes`, or None when layouts are left to the partitioner."""
        if self.mesh is None or not self.constrain_rows:
            return None
        return lambda x: self.constrain(x, axes)

    def rollout_weights_program(self, state: nnx.State) -> Any:
        """The jitted program that makes, from `state`, the weights prefill and decode read (here: a cast to
        the compute dtype), or None when they read `state` as it is. Overridden by each weight layout."""
        if any(jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != self.model.compute_dtype
               for x in jax.tree.leaves(state)):
            return self._cast
        return None

    def prepare_weights(self, state: nnx.State) -> nnx.State:
        """The weights prefill and decode read: `rollout_weights_program` run on `state`."""
        program = self.rollout_weights_program(state)
        return state if program is None else program(state)

    def constrain(self, x: jax.Array, axes: tuple) -> jax.Array:
        """Layout hook for arrays inside the jitted calls (`axes`: the model's axes for it); overridable."""
        if self.mesh is None:
            return x
        sharding = NamedSharding(self.mesh, fit_spec(x.shape, axes, self.mesh))
        return jax.lax.with_sharding_constraint(x, sharding)

    def _prefill_impl(self, state, prompt_ids, prompt_mask, rng, temperature, top_p, rows=None, *, top_k,
                      use_top_p, greedy):
        """Prefill the prompts [U, P] into a cache of P + segments[0] slots and sample every row's first
        token. rows [B] (optional): the prompt each row repeats (shared prefill); None: one row per prompt."""
        self.compile_count += 1
        model = self._model(state)
        prompt_len = prompt_ids.shape[1]
        positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
        logits, cache = model.prefill(prompt_ids, positions, prompt_mask, prompt_len, self.cache_dtype,
                                      rows=None if rows is not None else self._rows_layout(model))
        if rows is not None:  # each row takes its prompt's logits and cache
            rows_layout = self._rows_layout(model) or (lambda x: x)
            logits = rows_layout(jnp.take(logits, rows, axis=0))
            cache = model.map_cache(lambda x: jnp.take(x, rows, axis=0), cache)
            prompt_mask = jnp.take(prompt_mask, rows, axis=0)
        batch = prompt_mask.shape[0]
        cache_axes = model.config.sharding.kv_cache
        free = ((0, 0), (0, 0), (0, self.segments[0]), (0, 0))
        cache = model.map_cache(lambda x: self.constrain(jnp.pad(x, free), cache_axes), cache)
        kv_mask = jnp.concatenate([prompt_mask, jnp.zeros((batch, self.segments[0]), jnp.int32)], axis=1)
        tokens, logprobs = sample_logits(logits, jax.random.fold_in(rng, 0), temperature, top_p,
                                         top_k=top_k, use_top_p=use_top_p, greedy=greedy)
        return cache, kv_mask, tokens, logprobs

    def _decode_impl(self, state, cache, kv_mask, first_tokens, first_logprobs, prompt_lens, rng, temperature,
                     top_p, *, top_k, use_top_p, greedy):
        """The decode loop from prefill's cache (the prompt bucket + segments[0] slots): one while_loop a
        segment, each later one's cache the previous one's padded to its length, entered only while some
        row is still going."""
        self.compile_count += 1
        model = self._model(state)
        batch, n = first_tokens.shape[0], self.max_new_tokens
        prompt_width = kv_mask.shape[1] - self.segments[0]
        eos = jnp.asarray(self.eos_ids, jnp.int32)
        tokens = jnp.full((batch, n), self.pad_id, jnp.int32).at[:, 0].set(first_tokens)
        logprobs = jnp.zeros((batch, n), jnp.float32).at[:, 0].set(first_logprobs)
        done = jnp.isin(first_tokens, eos)
        # Every step's uniforms in one draw before the loop: no PRNG work inside it.
        uniforms = self.constrain(jax.random.uniform(jax.random.fold_in(rng, 1), (batch, n), jnp.float32),
                                   model.config.sharding.batch)
        cache_axes = model.config.sharding.kv_cache

        def body(carry):
            return self._decode_step(model, carry, uniforms, prompt_lens, temperature, top_p, eos,
                                     prompt_width=prompt_width, top_k=top_k, use_top_p=use_top_p,
                                     greedy=greedy)

        def run(segment: int, carry: tuple) -> tuple:
            """Segments `segment`, ... from carry: (tokens, logprobs), and the last segment's cache and slot
            mask when it is the last (a shorter cache, when rows end before it, has another shape)."""
            end = self.segments[segment]
            i, cache, kv_mask, tokens, logprobs, done = jax.lax.while_loop(
                lambda c: (c[0] < end) & ~jnp.all(c[5]), body, carry)
            if segment == len(self.segments) - 1:
                return tokens, logprobs, cache, kv_mask

            def grow(carry: tuple) -> tuple:
                i, cache, kv_mask, tokens, logprobs, done = carry
                more = self.segments[segment + 1] - end
                free = ((0, 0), (0, 0), (0, more), (0, 0))
                cache = model.map_cache(lambda x: self.constrain(jnp.pad(x, free), cache_axes), cache)
                kv_mask = jnp.pad(kv_mask, ((0, 0), (0, more)))
                return run(segment + 1, (i, cache, kv_mask, tokens, logprobs, done))[:2]

            return jax.lax.cond(jnp.all(done), lambda c: (c[3], c[4]), grow,
                                (i, cache, kv_mask, tokens, logprobs, done))

        tokens, logprobs, *kept = run(0, (jnp.int32(1), cache, kv_mask, tokens, logprobs, done))
        is_end = jnp.isin(tokens, eos).astype(jnp.int32)
        completion_mask = ((jnp.cumsum(is_end, axis=1) - is_end) == 0).astype(jnp.int32)
        batch_axes = model.config.sharding.batch
        tokens, completion_mask = (self.constrain(tokens, batch_axes),
                                   self.constrain(completion_mask, batch_axes))
        logprobs = self.constrain(logprobs * completion_mask, batch_axes)
        # One segment: returning cache/kv_mask lets XLA alias the donated input buffers instead of copying.
        cache, kv_mask = kept if kept else (None, None)
        return tokens, completion_mask, logprobs, cache, kv_mask

    def _decode_step(self, model, carry, uniforms, prompt_lens, temperature, top_p, eos, *, prompt_width,
                     top_k, use_top_p, greedy):
        """One token for every row: the decode loop's body (the planner also compiles it alone, to measure
        what one generated token costs). The cache holds the prompt's `prompt_width` slots and any number
        after them that covers this step's."""
        i, cache, kv_mask, tokens, logprobs, done = carry
        batch = tokens.shape[0]
        slot = prompt_width + i - 1  # cache slot of the previous token, fed now
        kv_mask = jax.lax.dynamic_update_slice(kv_mask, jnp.ones((batch, 1), jnp.int32), (0, slot))
        previous = jax.lax.dynamic_slice(tokens, (0, i - 1), (batch, 1))
        positions = (prompt_lens + i - 1)[:, None]
        layout = self._decode_layout(model)
        sample_here = layout is not None and layout.sample is not None  # the layout samples, not the logits
        out, cache = model.decode(previous, positions, kv_mask, cache, slot, rows=self._rows_layout(model),
                                  cache_layout=self._cache_layout(model), layout=layout,
                                  hidden_only=sample_here)
        uniform = jax.lax.dynamic_slice(uniforms, (0, i), (batch, 1))[:, 0]
        if sample_here:
            new, new_logprobs = layout.sample(out, model.norm, *model.head_weight(), uniform, temperature,
                                              top_p, top_k=top_k, use_top_p=use_top_p, greedy=greedy)
        else:
            new, new_logprobs = sample_with_uniform(out, uniform, temperature, top_p, top_k=top_k,
                                                    use_top_p=use_top_p, greedy=greedy)
        new = jnp.where(done, self.pad_id, new)
        new_logprobs = jnp.where(done, 0.0, new_logprobs)
        tokens = jax.lax.dynamic_update_slice(tokens, new[:, None], (0, i))
        logprobs = jax.lax.dynamic_update_slice(logprobs, new_logprobs[:, None], (0, i))
        return i + 1, cache, kv_mask, tokens, logprobs, done | jnp.isin(new, eos)

    def decode_step_program(self, *, top_k: int, use_top_p: bool, greedy: bool,
                            prompt_width: int | None = None, cache_layout_for: tuple | None = None) -> Any:
        """A jitted single decode step over (state, carry, uniforms, prompt_lens, temperature, top_p), the
        cache donated as in the loop. prompt_width: the prompt bucket; None: the carry's kv_mask is as
        prefill makes it (the prompt bucket + segments[0] slots). A carry whose cache holds more slots
        (up to cache_slots) prices a later step of the loop. cache_layout_for: abstract arguments (their
        shardings taken as the program's) for a program whose KV cache, in and out, is in the memory
        layout the compiler chooses, as the loop's carry holds it, not the default layout of a caller's
        array: the planner's step over a stacked cache (trainer/scanned.py), which otherwise copies the
        whole cache into the layer loop's layout and back, copies the loop makes once, not every token."""

        def step(state, carry, uniforms, prompt_lens, temperature, top_p):
            eos = jnp.asarray(self.eos_ids, jnp.int32)
            width = carry[2].shape[1] - self.segments[0] if prompt_width is None else prompt_width
            return self._decode_step(self._model(state), carry, uniforms, prompt_lens, temperature, top_p,
                                     eos, prompt_width=width, top_k=top_k, use_top_p=use_top_p,
                                     greedy=greedy)

        if cache_layout_for is None:
            return jax.jit(self._under_matmul_output(step), donate_argnums=(1,))
        from jax.experimental.layout import Format, Layout

        def sharding(x: Any) -> Any:
            return x.sharding

        state, carry, *rest = cache_layout_for
        carry_in = (sharding(carry[0]), jax.tree.map(lambda x: Format(Layout.AUTO, x.sharding), carry[1]),
                    *jax.tree.map(sharding, tuple(carry[2:])))
        return jax.jit(self._under_matmul_output(step), donate_argnums=(1,), out_shardings=carry_in,
                       in_shardings=(jax.tree.map(sharding, state), carry_in, *jax.tree.map(sharding, rest)))

    def cache_slots(self, prompt_width: int) -> int:
        """The most KV-cache slots a row holds (the last segment's): the prompt bucket + max new tokens.
        Prefill's cache holds prompt_width + segments[0]."""
        return prompt_width + self.segments[-1]

    # ---- host side --------------------------------------------------------------------------------------

    def bucket_for(self, longest_prompt: int) -> int:
        for bucket in self.buckets:
            if longest_prompt <= bucket:
                return bucket
        raise ValueError(f"a prompt has {longest_prompt} tokens, more than the largest bucket "
                         f"{self.buckets[-1]}; add a larger bucket or shorten the prompt")

    def place(self, array: np.ndarray) -> jax.Array:
        """Put a host batch on device(s); with a mesh, rows are split over the data axes. Overridable hook."""
        if self.mesh is None:
            return jnp.asarray(array)
        axes = self.model.config.sharding.batch
        sharding = NamedSharding(self.mesh, fit_spec(array.shape, axes, self.mesh))
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    def pad_prompts(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Left-pad token lists to their bucket: ids and mask [B, bucket] int32."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs a non-empty list of non-empty prompts")
        width = self.bucket_for(max(len(p) for p in prompts))
        ids = np.full((len(prompts), width), self.pad_id, np.int32)
        mask = np.zeros((len(prompts), width), np.int32)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
        return ids, mask

    def cache_prompt_width(self, padded_width: int, longest_prompt: int) -> int:
        """The prompt slots the KV cache holds, for prompts left-padded to `padded_width` whose longest
        (here) has `longest_prompt` tokens: the padded width (overridable: ShardedSampler pads every
        prompt to one fixed width and trims the cache to a bucket)."""
        return padded_width

    def shared_prompts(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """For a shared prefill: the rows of `ids` [B, P] to prefill (one per distinct prompt, padded with
        repeats to a multiple of the device count so they split as rows do) and, for each row, the index
        among those of its prompt. None when no prompt repeats, or across processes (each holds only its
        own rows)."""
        if jax.process_count() > 1:
            return None
        _, first, inverse = np.unique(ids, axis=0, return_index=True, return_inverse=True)
        multiple = 1 if self.mesh is None else self.mesh.size
        count = -(-len(first) // multiple) * multiple
        if count >= len(ids):
            return None
        order = np.argsort(first)  # distinct prompts in the order they first appear
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        distinct = np.concatenate([first[order], np.full(count - len(first), first[order][-1])])
        return distinct, rank[inverse.reshape(-1)].astype(np.int32)

    def generate(self, prompts: Sequence[Sequence[int]], rng: jax.Array | int, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
                 state: nnx.State | None = None) -> RolloutBatch:
        """Sample up to max_new_tokens for each prompt (token-id lists, any lengths up to the largest bucket).

        state: model parameters to use (default: the model's current ones, so in-place updates are seen).
        Arrays come back on device ([B, ...], rows sharded over the data axes when a mesh is given).
        """
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling (got {temperature}); use greedy=True")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if isinstance(rng, int):
            rng = jax.random.key(rng)
        ids, mask = self.pad_prompts(prompts)
        prompt_ids, prompt_mask = self.place(ids), self.place(mask)
        prompt_lens = self.place(mask.sum(axis=1).astype(np.int32))
        # The cache holds the last `width` prompt slots: those left of them are padding in every row.
        width = self.cache_prompt_width(ids.shape[1], max(len(p) for p in prompts))
        if width < ids.shape[1]:
            ids, mask = ids[:, -width:], mask[:, -width:]
            run_ids, run_mask = self.place(ids), self.place(mask)
        else:
            run_ids, run_mask = prompt_ids, prompt_mask
        state = self.prepare_weights(nnx.state(self.model) if state is None else state)
        statics = {"top_k": int(top_k), "use_top_p": top_p < 1.0, "greedy": bool(greedy)}
        temperature_, top_p_ = jnp.float32(temperature), jnp.float32(top_p)
        shared = self.shared_prompts(ids)
        if shared is None:
            prefill_inputs: tuple = (run_ids, run_mask)
        else:
            distinct, rows = shared
            prefill_inputs = (self.place(ids[distinct]), self.place(mask[distinct]), self.place(rows))
        cache, kv_mask, first, first_logprobs = self.prefill(
            state, *prefill_inputs[:2], rng, temperature_, top_p_, *prefill_inputs[2:], **statics)
        tokens, completion_mask, logprobs, _, _ = self.decode_loop(
            state, cache, kv_mask, first, first_logprobs, prompt_lens, rng, temperature_, top_p_, **statics)
        return RolloutBatch(prompt_ids, prompt_mask, tokens, completion_mask, logprobs)
