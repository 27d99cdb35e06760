"""The model with its blocks as one scanned layer (`train.scan_layers`), as MaxText's `scan_layers` does.

`ScannedQwen2` keeps every block's weights stacked on a leading [layers] axis (each sharded as one block's
weights are, the layer axis whole) and runs each of its forwards as one `jax.lax.scan` over them: the
training forward, and the rollout's prefill and decode step. The update, the log-prob pass, prefill and the
decode loop are then one block's program run `num_hidden_layers` times, not 28 or 36 copies of it:
compiling them for a TPU slice takes a few GB of host memory and minutes less (issue 26: a 7B batch sweep
was killed by a 24 GB laptop's OOM killer; a 3B plan took 4:21 with the rollout unrolled), and the planner
compiles exactly what the Trainer runs (trainer/programs.py builds both).

The rollout's sampler for it is trainer/rollout/stacked.py (the weights stay stacked). The KV cache is
one (keys, values) pair stacked [layers, B, kv_heads, S,
head_dim]: prefill's scan returns each layer's as its output; the decode step carries the whole stack
through its scan and each layer writes its token's slot in place (Attention.decode with `layer`) and reads
its slice, so a step holds one cache, as the unrolled step does. Every DecodeLayout hook (megatron's and
head_groups' shard_maps included) runs inside the scan's body on that layer's weights. Prefill runs the
last block over every prompt position (the unrolled prefill runs its MLP for the last position only):
about 1/layers of the MLP's flops more, for one block's program instead of two.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from trainer.model import (
    DecodeOptions,
    KVCache,
    Qwen2Config,
    Qwen2ForCausalLM,
    rotary_tables,
)
from trainer.param_sharding import constrain_batch, placed_abstract


class ScannedQwen2(Qwen2ForCausalLM):
    """Qwen2ForCausalLM whose `layers` is a single Block holding every block's weights stacked [layers, ...];
    the training forward, prefill and decode scan over them, the KV cache stacked alike. Same arithmetic
    as the unrolled model, one block's program."""

    def __init__(self, config: Qwen2Config, rngs: nnx.Rngs, param_dtype: Any = jnp.float32,
                 compute_dtype: Any = jnp.bfloat16, remat: bool = False):
        # One block is built (its weights are stacked afterwards, see scanned_model_shapes).
        super().__init__(dataclasses.replace(config, num_hidden_layers=1), rngs, param_dtype=param_dtype,
                         compute_dtype=compute_dtype, remat=remat)
        self.config = config

    def hidden_states(self, input_ids: jax.Array, positions: jax.Array,
                      attention_mask: jax.Array) -> jax.Array:
        t = input_ids.shape[1]
        valid = attention_mask.astype(bool)
        mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
        cos, sin = rotary_tables(positions, self.config.dim_per_head, self.config.rope_theta)
        x = constrain_batch(self._embed(input_ids), self.config.sharding.batch)
        graphdef, stacked = nnx.split(self.layers[0])

        def block(x: jax.Array, weights: Any) -> tuple[jax.Array, None]:
            x = nnx.merge(graphdef, weights)(x, cos, sin, mask)
            return constrain_batch(x, self.config.sharding.batch), None

        if self.remat:  # as the unrolled model's nnx.remat: recompute each block in the backward pass
            block = jax.checkpoint(block)
        x, _ = jax.lax.scan(block, x, stacked)
        return self.norm(x)

    def init_cache(self, batch: int, length: int, dtype: Any = None) -> KVCache:
        c = self.config
        shape = (c.num_hidden_layers, batch, c.num_key_value_heads, length, c.dim_per_head)
        dtype = dtype or self.compute_dtype
        return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)

    def map_cache(self, fn: Any, cache: KVCache) -> KVCache:
        """`fn` (written for one layer's [B, kv_heads, S, head_dim]) over the stacked keys and values,
        mapped over the layer axis (a layout constraint leaves that axis whole)."""
        keys, values = cache
        return jax.vmap(fn)(keys), jax.vmap(fn)(values)

    def _prefill_layers(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array,
                        cache_length: int, dtype: Any, options: DecodeOptions) -> tuple[jax.Array, KVCache]:
        free = ((0, 0), (0, 0), (0, cache_length - x.shape[1]), (0, 0))
        graphdef, stacked = nnx.split(self.layers[0])

        def block(x: jax.Array, weights: Any) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            x, (k, v) = nnx.merge(graphdef, weights).prefill(x, cos, sin, mask, last_only=False,
                                                             out_dtype=options.matmul_dtype)
            return x, (jnp.pad(k.astype(dtype), free), jnp.pad(v.astype(dtype), free))

        return jax.lax.scan(block, x, stacked, unroll=not options.roll_layers)

    def _decode_layers(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array, cache: KVCache,
                       cache_index: jax.Array, options: DecodeOptions) -> tuple[jax.Array, KVCache]:
        graphdef, stacked = nnx.split(self.layers[0])

        def block(carry: tuple, weights: Any) -> tuple[tuple, None]:
            x, cache, layer = carry
            x, cache = nnx.merge(graphdef, weights).decode(x, cos, sin, mask, cache, cache_index, options,
                                                           layer=layer)
            return (x, cache, layer + 1), None

        # The cache rides in the carry (updated in place), not in xs/ys (a second stacked cache).
        (x, cache, _), _ = jax.lax.scan(block, (x, tuple(cache), jnp.int32(0)), stacked,
                                        unroll=not options.roll_layers)
        return x, cache


def scanned_model_shapes(config: Qwen2Config, *, param_dtype: Any = jnp.float32,
                         compute_dtype: Any = jnp.bfloat16, remat: bool = False) -> ScannedQwen2:
    """ScannedQwen2 with ShapeDtypeStructs for weights (nothing allocated), the blocks' weights [layers, ...];
    each parameter's `out_sharding` metadata names the axes of its dims (the layer axis None)."""
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: ScannedQwen2(config, nnx.Rngs(0), param_dtype=param_dtype,
                                                    compute_dtype=compute_dtype, remat=remat))
    for _, var in nnx.iter_graph(model.layers):
        if isinstance(var, nnx.Param):
            axes = tuple(var.get_metadata().get("out_sharding") or ())
            var.set_value(jax.ShapeDtypeStruct((config.num_hidden_layers, *var.shape), var.dtype))
            if axes:
                var.set_metadata("out_sharding", (None, *axes))
    return model


def abstract_scanned_model(model_config: Qwen2Config, mesh: Mesh, *, compute_dtype: Any,
                           remat: bool) -> ScannedQwen2:
    """scanned_model_shapes with every weight's sharding: fit_spec of its axes, as the loader places it."""
    model = scanned_model_shapes(model_config, compute_dtype=compute_dtype, remat=remat)
    return placed_abstract(model, mesh)
