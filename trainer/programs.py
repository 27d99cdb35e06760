"""Every jitted program a training run executes, built once from a model and a mesh.

The model may hold real weights (the Trainer, trainer/train.py) or only their shapes and shardings (the
planner, trainer/planner/plan.py, which compiles these same objects for a TPU slice). One builder for both
means the plan measures the programs the run executes, not a re-creation of them:

- `init_optimizer`: the optimizer state, laid out like the parameters it tracks (AdamW's moments sharded
  as the weights are; left to itself, `jit(optimizer.init)` puts them on one device).
- `sampler`: prefill and the decode loop (trainer/rollout/): a ShardedSampler, or for a scanned model
  (`train.scan_layers`) a StackedWeightsSampler, whose prefill and decode scan over the stacked weights and
  a stacked KV cache (trainer/rollout/stacked.py).
- `step_fn.logprobs`: log-prob recomputation (reference / old policy); `step_fn.update`: the update with its
  micro-batches (trainer/grpo.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.config import TrainerConfig
from trainer.grpo import GRPOStep, LossSettings, chunked_token_stats, make_optimizer, make_schedule
from trainer.mesh import train_sharding
from trainer.model import Qwen2Config, Qwen2ForCausalLM, project_logits
from trainer.param_sharding import placed_abstract
from trainer.rollout.layouts import RolloutLayout
from trainer.rollout.sharded import ShardedSampler
from trainer.rollout.stacked import StackedWeightsSampler
from trainer.scanned import ScannedQwen2, abstract_scanned_model

# `train.compute_dtype`'s values.
DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}


def completion_token_stats_fn(graphdef: Any, prompt_len: int, chunk: int) -> Any:
    """GRPOStep's token_stats_fn for the Qwen2 model: log-probs and entropy of the completion tokens, the
    vocabulary projected `chunk` positions at a time (trainer/grpo.py `chunked_token_stats`)."""

    def token_stats(
        params: Any,
        rest: Any,
        ids: jax.Array,
        positions: jax.Array,
        mask: jax.Array,
        targets: jax.Array,
        temperature: float,
    ) -> tuple[jax.Array, jax.Array]:
        model = nnx.merge(graphdef, params, rest)
        hidden = model.hidden_states(ids, positions, mask)[:, prompt_len - 1 : -1]
        weight, vocab_major = model.head_weight()
        compute_dtype = model.compute_dtype

        def head(h: jax.Array) -> jax.Array:
            return project_logits(h, weight, vocab_major, compute_dtype)

        return chunked_token_stats(hidden, head, targets, temperature, chunk)

    return token_stats


def optimizer_state_shardings(
    optimizer: optax.GradientTransformation, params: Any, param_shardings: Any, mesh: Mesh
) -> Any:
    """The optimizer state's shardings: every parameter-shaped leaf (moments) like its parameter, the rest
    (step counts) replicated."""
    abstract = jax.eval_shape(optimizer.init, params)
    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract,
        param_shardings,
        transform_non_params=lambda _: replicated,
    )


def abstract_model(cfg: TrainerConfig, model_config: Qwen2Config, mesh: Mesh) -> Qwen2ForCausalLM:
    """The model the Trainer loads for `cfg` (trainer/weights.py `load_model`), with ShapeDtypeStructs for
    weights (nothing allocated), each carrying the sharding the loader gives it: a ScannedQwen2 with the
    blocks' weights stacked when `train.scan_layers`, else the unrolled Qwen2ForCausalLM. The planner
    compiles the run's programs over it."""
    t = cfg.train
    dtype = DTYPES[t.compute_dtype]
    if t.scan_layers:
        return abstract_scanned_model(model_config, mesh, compute_dtype=dtype, remat=t.remat)
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: Qwen2ForCausalLM(model_config, nnx.Rngs(0), param_dtype=jnp.float32,
                                                        compute_dtype=dtype, remat=t.remat))
    return placed_abstract(model, mesh)


@dataclass
class RunPrograms:
    graphdef: Any
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    param_shardings: Any
    opt_shardings: Any
    init_optimizer: Any  # jitted: params -> optimizer state, laid out by opt_shardings
    sampler: ShardedSampler
    step_fn: GRPOStep


@dataclass
class TrainingPrograms:
    graphdef: Any
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    param_shardings: Any
    opt_shardings: Any
    init_optimizer: Any  # jitted: params -> optimizer state, laid out by opt_shardings
    step_fn: GRPOStep


def training_programs(cfg: TrainerConfig, model: Qwen2ForCausalLM, mesh: Mesh) -> TrainingPrograms:
    """The optimizer and the log-prob / update programs for `model` (unrolled, or scanned with its blocks'
    weights stacked, trainer/scanned.py: whatever its params' tree, they are trained alike)."""
    t, r = cfg.train, cfg.rollout
    graphdef, params, _ = nnx.split(model, nnx.Param, ...)
    param_shardings = jax.tree.map(lambda x: x.sharding, params)
    schedule = make_schedule(
        t.learning_rate, t.lr_schedule, cfg.steps * t.ppo_epochs, t.warmup_steps, t.min_lr_ratio
    )
    optimizer = make_optimizer(
        t.optimizer, schedule, clip_norm=t.clip_norm, weight_decay=t.weight_decay, b1=t.b1, b2=t.b2
    )
    opt_shardings = optimizer_state_shardings(optimizer, params, param_shardings, mesh)
    init_optimizer = jax.jit(optimizer.init, out_shardings=opt_shardings)
    per_device = r.batch_size * r.n // (mesh.shape["dp"] * mesh.shape["fsdp"])
    step_fn = GRPOStep(
        completion_token_stats_fn(graphdef, r.global_length, t.logprob_chunk),
        optimizer,
        prompt_len=r.global_length,
        temperature=r.temperature,
        micro_batches=per_device // t.micro_batch_size_per_device,
        loss=LossSettings(t.epsilon_low, t.epsilon_high, t.beta),
        batch_sharding=train_sharding(mesh),
        state_shardings=(param_shardings, opt_shardings),
    )
    return TrainingPrograms(graphdef, optimizer, schedule, param_shardings, opt_shardings, init_optimizer,
                            step_fn)


def build_programs(
    cfg: TrainerConfig,
    model: Qwen2ForCausalLM,
    mesh: Mesh,
    *,
    pad_id: int,
    eos_ids: Sequence[int],
    rollout_layout: RolloutLayout | None = None,
) -> RunPrograms:
    """The run's programs for `model` (real or abstract, its params placed or described with shardings).
    rollout_layout: the layout already resolved from `cfg` (the Trainer records it before it loads the
    model); None: resolved here."""
    r = cfg.rollout
    training = training_programs(cfg, model, mesh)
    # A scanned model's rollout scans too: its weights stay stacked (trainer/scanned.py).
    sampler_class = StackedWeightsSampler if isinstance(model, ScannedQwen2) else ShardedSampler
    sampler = sampler_class(
        model,
        pad_id,
        eos_ids,
        prompt_len=r.global_length,
        max_new_tokens=r.max_length_sample,
        mesh=mesh,
        weight_layout=rollout_layout or r.weight_layout,
        mesh_shape=cfg.mesh_shape,
        weight_copies=r.weight_copies,
    )
    return RunPrograms(
        training.graphdef, training.optimizer, training.schedule, training.param_shardings,
        training.opt_shardings, training.init_optimizer, sampler, training.step_fn
    )
