"""The model with its blocks as one scanned layer (`train.scan_layers`), as MaxText's `scan_layers` does.

`ScannedQwen2` keeps every block's weights stacked on a leading [layers] axis (each sharded as one block's
weights are, the layer axis whole) and runs the training forward as one `jax.lax.scan` over them. The
update and the log-prob pass are then one block's program run `num_hidden_layers` times, not 28 or 36
copies of it: compiling them for a TPU slice takes a few GB of host memory and minutes less (issue 26:
a 7B batch sweep was killed by a 24 GB laptop's OOM killer), and the planner compiles exactly what the
Trainer runs (trainer/programs.py builds both).

The rollout (trainer/rollout.py) keeps its unrolled model: prefill and decode walk the layers with a KV
cache per layer. `StackedWeightsSampler` is the one place where the stacked weights become the per-layer
weights it reads: its `rollout_weights_program` (what `generate` runs first) unstacks, casts to the compute
dtype and lays them out for the rollout in one program, so the rollout holds the same bf16 copy it holds
for an unrolled model.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.model import (
    Qwen2Config,
    Qwen2ForCausalLM,
    constrain_batch,
    placed_abstract,
    rotary_tables,
)
from trainer.rollout_sharding import ShardedSampler


class ScannedQwen2(Qwen2ForCausalLM):
    """Qwen2ForCausalLM whose `layers` is a single Block holding every block's weights stacked [layers, ...];
    the training forward scans over them. Same arithmetic as the unrolled model, one block's program.
    Prefill and decode are the unrolled model's (`unrolled_view`, `StackedWeightsSampler`)."""

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

    def init_cache(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a scanned model does not decode; the rollout runs unrolled_view(model) with "
                        "unstacked_layers(state) (StackedWeightsSampler)")

    prefill = decode = init_cache


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


# ---- the rollout's per-layer weights ---------------------------------------------------------------------


def unrolled_view(model: ScannedQwen2) -> Qwen2ForCausalLM:
    """The unrolled Qwen2ForCausalLM of the same config and dtypes, weights as shapes only (no memory): the
    graph the rollout runs, fed the weights `unstacked_layers` makes."""
    param_dtype = model.embed_tokens.get_value().dtype
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(lambda: Qwen2ForCausalLM(model.config, nnx.Rngs(0), param_dtype=param_dtype,
                                                       compute_dtype=model.compute_dtype, remat=model.remat))


def is_stacked(state: nnx.State) -> bool:
    """Whether a model state holds the blocks stacked (a ScannedQwen2's), from its first block's q kernel."""
    return jnp.ndim(state["layers"][0]["self_attn"]["q_proj"]["kernel"]) == 3


def _unrolled(pure: dict, layers: int, take: Any) -> dict:
    """A scanned model's pure state dict with its stacked block (layers[0]) as `layers` blocks, block i's
    leaves `take(leaf, i)`."""
    out = dict(pure)
    out["layers"] = {i: jax.tree.map(lambda x, i=i: take(x, i), pure["layers"][0]) for i in range(layers)}
    return out


def _as_state(pure: dict, template: nnx.State) -> nnx.State:
    out = jax.tree.map(lambda x: x, template)  # a copy of the template's structure
    nnx.replace_by_pure_dict(out, pure)
    return out


def unstacked_layers(state: nnx.State, template: nnx.State) -> nnx.State:
    """The unrolled model's state (`template`'s structure: layers 0..L-1) from a scanned model's state (every
    block's weights stacked under layers[0]); the other weights as they are. Traced inside a program."""
    return _as_state(_unrolled(state.to_pure_dict(), len(template["layers"]), lambda x, i: x[i]), template)


def per_layer_shardings(state: nnx.State, template: nnx.State) -> nnx.State:
    """Where an unrolled model's weights lie when they lie as the stacked ones do: each block's as its slice
    of the stack does (the layer axis dropped), the rest as they are."""

    def slice_of(sharding: Any, _: int) -> Any:
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[1:]))
        return sharding  # one device: the same

    shardings = jax.tree.map(lambda x: x.sharding, state.to_pure_dict())
    return _as_state(_unrolled(shardings, len(template["layers"]), slice_of), template)


class StackedWeightsSampler(ShardedSampler):
    """ShardedSampler for a ScannedQwen2: prefill and decode run `unrolled_view(model)`, and `generate`
    takes the scanned model's state. Its `rollout_weights_program` turns the stacked state into the
    per-layer weights the rollout reads in one program: unstacked, cast to the compute dtype and laid out
    where the configured weight layout puts the unrolled model's (ShardedSampler.rollout_weight_shardings),
    so the rollout holds one bf16 copy, as it does for an unrolled model."""

    def __init__(self, model: ScannedQwen2, *args: Any, **kwargs: Any) -> None:
        super().__init__(unrolled_view(model), *args, **kwargs)
        self._template = nnx.state(self.model)
        self._from_stacked: dict[Any, Any] = {}  # one program per state structure

    def _unrolled_shapes(self, state: nnx.State) -> nnx.State:
        """The unrolled state `state` unstacks to, as ShapeDtypeStructs lying where the stack's slices lie."""
        shapes = jax.eval_shape(functools.partial(unstacked_layers, template=self._template), state)
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                            per_layer_shardings(state, self._template))

    def rollout_weight_shardings(self, state: nnx.State) -> Any:
        if not is_stacked(state):
            return super().rollout_weight_shardings(state)
        return super().rollout_weight_shardings(self._unrolled_shapes(state))

    def rollout_weights_program(self, state: nnx.State) -> Any:
        """The jitted stacked state -> the rollout's weights (built once per structure); an unrolled state
        as ShardedSampler makes it."""
        if not is_stacked(state):
            return super().rollout_weights_program(state)
        key = jax.tree.structure(state)
        if key not in self._from_stacked:
            dtype = self.model.compute_dtype

            def prepare(stacked: nnx.State) -> nnx.State:
                unrolled = unstacked_layers(stacked, self._template)
                return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                                    unrolled)

            self._from_stacked[key] = jax.jit(prepare, out_shardings=self.rollout_weight_shardings(state))
        return self._from_stacked[key]
