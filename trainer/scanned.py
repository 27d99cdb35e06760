"""The training programs with the model's blocks as one scanned layer, for the planner.

The Trainer's model (trainer/model.py) runs its blocks as a Python loop: traced and compiled as N copies of
one block, 28 for Qwen2.5-7B and 36 for 3B. Compiling the update of such a program for a TPU slice holds
several GB of host memory and minutes of compile time per copy count (issue 26: a 7B batch sweep was
killed by a 24 GB laptop's OOM killer). The planner asks only for the per-chip figures, and those do not
depend on whether the blocks are unrolled: the same weights, optimizer state and batch are arguments, and
the temporaries of one block are live at a time either way. So the planner compiles the update and the
log-prob pass over `ScannedQwen2`: every block's weights stacked on a leading [layers] axis (sharded as one
block's weights are, the layer axis whole) and one `jax.lax.scan` over them, as MaxText's `scan_layers`
does. The loss, optimizer and micro-batching are the Trainer's own (trainer/programs.py
`training_programs`); tests/trainer/test_scanned.py holds the scanned figures against the unrolled ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from trainer.model import Qwen2Config, Qwen2ForCausalLM, constrain_batch, fit_spec, rotary_tables


class ScannedQwen2(Qwen2ForCausalLM):
    """Qwen2ForCausalLM whose `layers` is a single Block holding every block's weights stacked [layers, ...];
    the forward scans over them. Same arithmetic as the unrolled model, one block's program."""

    def __init__(self, config: Qwen2Config, rngs: nnx.Rngs, param_dtype: Any = jnp.float32,
                 compute_dtype: Any = jnp.bfloat16, remat: bool = False):
        # One block is built (its weights are stacked afterwards, see abstract_scanned_model).
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


def abstract_scanned_model(model_config: Qwen2Config, mesh: Mesh, *, compute_dtype: Any,
                           remat: bool) -> ScannedQwen2:
    """ScannedQwen2 with ShapeDtypeStructs for weights (nothing allocated): the blocks' weights [layers, ...]
    sharded as the loader shards one block's (fit_spec of its axes, the layer axis whole), the rest as the
    unrolled model's."""
    layers = model_config.num_hidden_layers
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: ScannedQwen2(model_config, nnx.Rngs(0), param_dtype=jnp.float32,
                                                    compute_dtype=compute_dtype, remat=remat))
    stacked = {id(var) for _, var in nnx.iter_graph(model.layers) if isinstance(var, nnx.Param)}
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            axes = tuple(var.get_metadata().get("out_sharding") or ())
            shape = tuple(var.shape)
            if id(var) in stacked:
                shape, axes = (layers, *shape), (None, *axes) if axes else ()
            var.set_value(jax.ShapeDtypeStruct(shape, var.dtype,
                                               sharding=NamedSharding(mesh, fit_spec(shape, axes, mesh))))
    return model


@dataclasses.dataclass
class TrainPrograms:
    """The update and log-prob programs the planner compiles, and their abstract arguments."""

    step_fn: Any  # trainer.grpo.GRPOStep
    params: Any
    rest: Any
    opt_state: Any


def scanned_training(cfg: Any, model_config: Qwen2Config, mesh: Mesh) -> TrainPrograms:
    """The Trainer's training programs (trainer/programs.py) built over the scanned twin of the model, with
    abstract params, the rest of the model state and the optimizer state laid out as the run lays them."""
    from trainer.programs import training_programs
    from trainer.train import DTYPES

    model = abstract_scanned_model(model_config, mesh, compute_dtype=DTYPES[cfg.train.compute_dtype],
                                   remat=cfg.train.remat)
    programs = training_programs(cfg, model, mesh)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    shapes = jax.eval_shape(programs.optimizer.init, params)
    opt_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes,
                             programs.opt_shardings)
    return TrainPrograms(programs.step_fn, params, rest, opt_state)
