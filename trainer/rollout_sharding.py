"""The rollout Sampler (trainer/rollout.py) across processes, with the batch laid out by sharding style.

Each process passes only its own prompts; they become one global batch (every process pads to the same
fixed length, so all of them compile the same program). `rollout.sharding_style` picks where rows live:
- `legacy`: batch over all mesh axes (dp, fsdp, tp): every device decodes its own rows.
- `maxtext`: batch over dp only, replicated over fsdp/tp: rows stay with the weights' data-parallel group.

`rollout.weight_layout` picks where the bf16 weights decode reads live:
- `fsdp`: sharded as in training. Each chip reads 1/N of the weights per token, but every layer's matmuls
  contract over a sharded dimension, so each token all-reduces partial sums in every layer and the logits.
- `replicated`: one all-gather per rollout makes a full bf16 copy on every chip; decode then needs no
  collective at all (each chip decodes its own rows). Costs the bf16 weights' size per chip.
The planner measures both (`python -m trainer plan`, benchmarks/plan.py): by the TPU compiler's figures,
fsdp with the logits kept on their rows and bf16 partial sums is the faster one per token, so it is the
default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.mesh import global_from_local_rows, rollout_sharding
from trainer.model import Qwen2ForCausalLM, fit_spec
from trainer.rollout import Sampler

_BATCH_AXES = {"legacy": ("dp", "fsdp", "tp"), "maxtext": ("dp",)}


class ShardedSampler(Sampler):
    """`Sampler` whose inputs are this process's rows and whose batch layout follows the sharding style."""

    def __init__(self, model: Qwen2ForCausalLM, pad_id: int, eos_ids: Sequence[int], *, prompt_len: int,
                 max_new_tokens: int, mesh: Mesh, style: str, weight_layout: str = "fsdp",
                 activation_layout: str = "rows", partial_sums: str = "auto",
                 cache_write: str = "auto") -> None:
        # One bucket: every process pads to the same width whatever its own longest prompt is.
        super().__init__(model, pad_id, eos_ids, buckets=(prompt_len,), max_new_tokens=max_new_tokens,
                         mesh=mesh, constrain_rows=activation_layout == "rows",
                         matmul_dtype=resolve_partial_sums(partial_sums, model.compute_dtype, mesh),
                         cache_write_as_bits=cache_write == "bits"
                         or (cache_write == "auto" and not _on_tpu(mesh)))
        if weight_layout not in ("fsdp", "replicated"):
            raise ValueError(f"weight_layout {weight_layout!r}: use fsdp or replicated")
        self.style = style
        self.weight_layout = weight_layout
        self.sharding = rollout_sharding(mesh, style)
        # Cast and gather in one program: each chip casts its shard, then the bf16 shards are gathered.
        self._replicate = jax.jit(self._cast_impl, out_shardings=NamedSharding(mesh, PartitionSpec()))

    def prepare_weights(self, state: nnx.State) -> nnx.State:
        if self.weight_layout == "replicated":
            return self._replicate(state)
        return super().prepare_weights(state)

    def place(self, array: np.ndarray) -> jax.Array:
        return global_from_local_rows(array, self.mesh, self.sharding)

    def constrain(self, x: jax.Array, axes: tuple) -> jax.Array:
        # Rows follow the rollout layout; the other dims keep the model's axes (the KV cache
        # [batch, kv_heads, length, head_dim] keeps its heads on tp), minus any axis the rows already use.
        spec = fit_spec(x.shape, rollout_axes(_BATCH_AXES[self.style], axes), self.mesh)
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))


def rollout_axes(batch_axes: tuple[str, ...], model_axes: tuple) -> tuple:
    """The model's axes for an activation or cache array with its batch dim replaced by the rollout's."""
    rest = tuple(None if entry in batch_axes else entry for entry in tuple(model_axes)[1:])
    return (batch_axes, *rest)


def _on_tpu(mesh: Mesh) -> bool:
    return mesh.devices.flat[0].platform == "tpu"


def resolve_partial_sums(setting: str, compute_dtype: Any, mesh: Mesh) -> Any:
    """`rollout.partial_sums`: auto = the compute dtype on TPU (bf16 partial sums cross the interconnect at
    half the bytes), fp32 elsewhere (XLA CPU widens a bf16-output dot to an fp32 one and is slower for it)."""
    if setting == "float32":
        return jnp.float32
    if setting == "compute" or (setting == "auto" and _on_tpu(mesh)):
        return compute_dtype
    return jnp.float32
