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
- The loop carries a `SamplingState` (the step, the cache, its slot mask, the tokens and log-probs so far,
  which rows are done), one token a row a step (`_decode_step`, which the planner also compiles alone).
- How the model traces prefill and a step (the matmuls' output dtype, how the cache is written, where rows
  and the cache live, an explicit decode step) is one value, `decode_options` (model.DecodeOptions), which
  a sampler laid out over devices (sharded.py) chooses for its layout.
- Compilations happen once per (batch size, bucket, sampling mode); `compile_count` counts them.

Tokens are drawn by sampling.py. Log-probs are those of the sampled token under softmax(logits /
temperature), before top-k/top-p truncation (greedy: temperature 1). A GRPO loss that recomputes log-probs
must divide its logits by the same temperature.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from trainer.model import DecodeLayout, DecodeOptions, KVCache, Qwen2ForCausalLM
from trainer.param_sharding import fit_spec
from trainer.rollout.sampling import sample_logits, sample_with_uniform


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RolloutBatch:
    prompt_ids: jax.Array  # [B, P] int32, left-padded with pad_id
    prompt_mask: jax.Array  # [B, P] int32, 1 = prompt token
    completion_ids: jax.Array  # [B, N] int32, pad_id after the end token
    completion_mask: jax.Array  # [B, N] int32, 1 up to and including the first end token
    logprobs: jax.Array  # [B, N] float32, 0 where completion_mask is 0


class SamplingState(NamedTuple):
    """What the decode loop carries from one token to the next (a pytree: a NamedTuple)."""

    step: jax.Array  # int32: the index of the token this step makes (the previous one is fed)
    cache: KVCache  # the KV cache, every slot of the current segment
    kv_mask: jax.Array  # [B, S] int32: 1 where a cache slot holds a real token
    tokens: jax.Array  # [B, N] int32: the tokens so far, pad_id after a row's end
    logprobs: jax.Array  # [B, N] float32: their log-probs, 0 after a row's end
    done: jax.Array  # [B] bool: the row has produced an end token


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
                 mesh: Mesh | None = None, cache_dtype: Any = None, matmul_dtype: Any = jnp.float32,
                 cache_write_as_bits: bool = True, attend_bucket: int = 128):
        """buckets: the prompt widths prompts are left-padded to (the smallest that fits). mesh: rows split
        over its data axes, activations, logits and the cache pinned to their rows' devices (None: one
        device). cache_dtype: the KV cache's (default the compute dtype). matmul_dtype: the weight matmuls'
        output dtype (their partial sums, where a layout all-reduces them). cache_write_as_bits: write a
        bf16 cache through an integer bitcast (XLA CPU otherwise widens the whole cache every token; on TPU
        it is a copy). ShardedSampler sets these two for its platform. attend_bucket: new tokens the first
        decode segment's cache holds, doubling each segment after (decode_segments); 0: one segment,
        attention over every `bucket + max_new_tokens` slot every step."""
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
        self.matmul_dtype = matmul_dtype  # of the weight matmuls' outputs (partial sums)
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
        self.prefill = jax.jit(self._prefill_impl, static_argnames=statics)
        # One segment: the loop updates the donated cache in place and returns it (XLA aliases it). With
        # several, each segment's cache is a new, longer buffer, which no output could take the place of.
        donated = ("cache", "kv_mask") if len(self.segments) == 1 else ()
        self.decode_loop = jax.jit(self._decode_impl, static_argnames=statics, donate_argnames=donated)

    @functools.cached_property
    def decode_options(self) -> DecodeOptions:
        """How the model traces prefill and a decode step (model.DecodeOptions), chosen once, when first
        traced: the matmuls' output dtype, the cache write, the scanned layer loop, the rows of the logits
        and the cache pinned to their devices on a mesh, and the layout's explicit step (decode_layout)."""
        axes = self.model.config.sharding
        return DecodeOptions(matmul_dtype=self.matmul_dtype, cache_write_as_bits=self.cache_write_as_bits,
                             roll_layers=self.roll_layers, rows=self._pinned(axes.batch),
                             cache=self._pinned(axes.kv_cache), layout=self.decode_layout())

    # ---- traced functions -------------------------------------------------------------------------------

    def _model(self, state: nnx.State) -> Qwen2ForCausalLM:
        return nnx.merge(self._graphdef, state)

    def _cast_impl(self, state: nnx.State) -> nnx.State:
        dtype = self.model.compute_dtype
        return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, state)

    def decode_layout(self) -> DecodeLayout | None:
        """The layout's explicit decode step (model.DecodeLayout); None: the model's plain code, its layout
        left to the partitioner (overridden by ShardedSampler)."""
        return None

    def _pinned(self, axes: tuple) -> Any:
        """A layout hook constraining an array to `axes`, or None without a mesh (one device)."""
        if self.mesh is None:
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
        options = self.decode_options
        prompt_len = prompt_ids.shape[1]
        positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
        # Shared prefill: the distinct prompts' logits are left to the partitioner, then each row's placed.
        logits, cache = model.prefill(prompt_ids, positions, prompt_mask, prompt_len, self.cache_dtype,
                                      options if rows is None else dataclasses.replace(options, rows=None))
        if rows is not None:  # each row takes its prompt's logits and cache
            logits = (options.rows or (lambda x: x))(jnp.take(logits, rows, axis=0))
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
        # Every step's uniforms in one draw before the loop: no PRNG work inside it.
        uniforms = self.constrain(jax.random.uniform(jax.random.fold_in(rng, 1), (batch, n), jnp.float32),
                                  model.config.sharding.batch)
        cache_axes = model.config.sharding.kv_cache

        def body(state: SamplingState) -> SamplingState:
            return self._decode_step(model, state, uniforms, prompt_lens, temperature, top_p, eos,
                                     prompt_width=prompt_width, top_k=top_k, use_top_p=use_top_p,
                                     greedy=greedy)

        def run(segment: int, state: SamplingState) -> SamplingState:
            """Segments `segment`, ... from `state`. The state after the last segment the rows reach: its
            cache and slot mask are the last segment's only when the rows reach it (a shorter cache, when
            every row ends before, has another shape), so only its tokens and log-probs leave a cond."""
            end = self.segments[segment]
            state = jax.lax.while_loop(lambda s: (s.step < end) & ~jnp.all(s.done), body, state)
            if segment == len(self.segments) - 1:
                return state

            def grow(state: SamplingState) -> tuple[jax.Array, jax.Array]:
                more = self.segments[segment + 1] - end
                free = ((0, 0), (0, 0), (0, more), (0, 0))
                cache = model.map_cache(lambda x: self.constrain(jnp.pad(x, free), cache_axes), state.cache)
                longer = state._replace(cache=cache, kv_mask=jnp.pad(state.kv_mask, ((0, 0), (0, more))))
                last = run(segment + 1, longer)
                return last.tokens, last.logprobs

            ended = jnp.all(state.done)
            tokens, logprobs = jax.lax.cond(ended, lambda s: (s.tokens, s.logprobs), grow, state)
            return state._replace(tokens=tokens, logprobs=logprobs)

        first = SamplingState(
            step=jnp.int32(1), cache=cache, kv_mask=kv_mask,
            tokens=jnp.full((batch, n), self.pad_id, jnp.int32).at[:, 0].set(first_tokens),
            logprobs=jnp.zeros((batch, n), jnp.float32).at[:, 0].set(first_logprobs),
            done=jnp.isin(first_tokens, eos))
        last = run(0, first)
        is_end = jnp.isin(last.tokens, eos).astype(jnp.int32)
        completion_mask = ((jnp.cumsum(is_end, axis=1) - is_end) == 0).astype(jnp.int32)
        batch_axes = model.config.sharding.batch
        tokens, completion_mask = (self.constrain(last.tokens, batch_axes),
                                   self.constrain(completion_mask, batch_axes))
        logprobs = self.constrain(last.logprobs * completion_mask, batch_axes)
        # One segment: returning cache/kv_mask lets XLA alias the donated input buffers instead of copying.
        cache, kv_mask = (last.cache, last.kv_mask) if len(self.segments) == 1 else (None, None)
        return tokens, completion_mask, logprobs, cache, kv_mask

    def _decode_step(self, model, state: SamplingState, uniforms, prompt_lens, temperature, top_p, eos, *,
                     prompt_width, top_k, use_top_p, greedy) -> SamplingState:
        """One token for every row: the decode loop's body (the planner also compiles it alone, to measure
        what one generated token costs). The cache holds the prompt's `prompt_width` slots and any number
        after them that covers this step's."""
        batch, i = state.tokens.shape[0], state.step
        slot = prompt_width + i - 1  # cache slot of the previous token, fed now
        kv_mask = jax.lax.dynamic_update_slice(state.kv_mask, jnp.ones((batch, 1), jnp.int32), (0, slot))
        previous = jax.lax.dynamic_slice(state.tokens, (0, i - 1), (batch, 1))
        positions = (prompt_lens + i - 1)[:, None]
        options = self.decode_options
        out, cache = model.decode(previous, positions, kv_mask, state.cache, slot, options)
        uniform = jax.lax.dynamic_slice(uniforms, (0, i), (batch, 1))[:, 0]
        if options.layout is not None:  # the layout samples from the final hidden states
            new, new_logprobs = options.layout.sample(out, model.norm, *model.head_weight(), uniform,
                                                      temperature, top_p, top_k=top_k, use_top_p=use_top_p,
                                                      greedy=greedy)
        else:
            new, new_logprobs = sample_with_uniform(out, uniform, temperature, top_p, top_k=top_k,
                                                    use_top_p=use_top_p, greedy=greedy)
        new = jnp.where(state.done, self.pad_id, new)
        new_logprobs = jnp.where(state.done, 0.0, new_logprobs)
        return SamplingState(
            step=i + 1, cache=cache, kv_mask=kv_mask,
            tokens=jax.lax.dynamic_update_slice(state.tokens, new[:, None], (0, i)),
            logprobs=jax.lax.dynamic_update_slice(state.logprobs, new_logprobs[:, None], (0, i)),
            done=state.done | jnp.isin(new, eos))

    def decode_step_program(self, *, top_k: int, use_top_p: bool, greedy: bool,
                            prompt_width: int | None = None, cache_layout_for: tuple | None = None) -> Any:
        """A jitted single decode step over (state, SamplingState, uniforms, prompt_lens, temperature, top_p),
        the cache donated as in the loop. prompt_width: the prompt bucket; None: the state's kv_mask is as
        prefill makes it (the prompt bucket + segments[0] slots). A state whose cache holds more slots
        (up to cache_slots) prices a later step of the loop. cache_layout_for: abstract arguments (their
        shardings taken as the program's) for a program whose KV cache, in and out, is in the memory
        layout the compiler chooses, as the loop's state holds it, not the default layout of a caller's
        array: the planner's step over a stacked cache (trainer/scanned.py), which otherwise copies the
        whole cache into the layer loop's layout and back, copies the loop makes once, not every token."""

        def step(weights, state, uniforms, prompt_lens, temperature, top_p):
            eos = jnp.asarray(self.eos_ids, jnp.int32)
            width = state.kv_mask.shape[1] - self.segments[0] if prompt_width is None else prompt_width
            return self._decode_step(self._model(weights), state, uniforms, prompt_lens, temperature, top_p,
                                     eos, prompt_width=width, top_k=top_k, use_top_p=use_top_p,
                                     greedy=greedy)

        if cache_layout_for is None:
            return jax.jit(step, donate_argnums=(1,))
        from jax.experimental.layout import Format, Layout

        def sharding(x: Any) -> Any:
            return x.sharding

        weights, state, *rest = cache_layout_for
        state_in = jax.tree.map(sharding, state)._replace(
            cache=jax.tree.map(lambda x: Format(Layout.AUTO, x.sharding), state.cache))
        in_shardings = (jax.tree.map(sharding, weights), state_in, *jax.tree.map(sharding, rest))
        return jax.jit(step, donate_argnums=(1,), out_shardings=state_in, in_shardings=in_shardings)

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
