"""The rollout Sampler (sampler.py) across processes and devices, laid out as its rollout layout says.

Each process passes only its own prompts; they become one global batch, rows split over every device
(every process pads to the same fixed length, so all of them compile the same program). The layout
(layouts.py: fsdp, megatron or head_groups, resolved once from the config) says where decode's bf16 weights
live (`rollout_weights_program`, weight_placement.py) and which decode step runs (`decode_layout`:
decode_layouts.py, or the model's plain step for fsdp).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.mesh import batch_sharding, global_from_local_rows, reshard
from trainer.model import DecodeLayout, Qwen2ForCausalLM
from trainer.param_sharding import fit_spec
from trainer.rollout.decode_layouts import head_group_layout, head_group_mesh, megatron_layout
from trainer.rollout.layouts import RolloutLayout, on_tpu, resolve_rollout_layout
from trainer.rollout.sampler import Sampler
from trainer.rollout.weight_placement import ALL_AXES, rollout_shardings


class ShardedSampler(Sampler):
    """`Sampler` whose inputs are this process's rows, with the weights, rows and decode step laid out as
    its RolloutLayout says (`self.layout`)."""

    def __init__(self, model: Qwen2ForCausalLM, pad_id: int, eos_ids: Sequence[int], *, prompt_len: int,
                 max_new_tokens: int, mesh: Mesh, weight_layout: str | RolloutLayout = "fsdp",
                 mesh_shape: str = "auto", weight_copies: int | str = "auto",
                 attend_bucket: int = 128) -> None:
        """weight_layout: `rollout.weight_layout` (resolved here with `mesh_shape` and `weight_copies` by
        resolve_rollout_layout), or a RolloutLayout already resolved. attend_bucket: the Sampler's."""
        if isinstance(weight_layout, RolloutLayout):
            layout = weight_layout
        else:
            layout = resolve_rollout_layout(weight_layout, model.config, mesh, mesh_shape=mesh_shape,
                                            copies=weight_copies)
        self.layout = layout
        self.train_mesh = mesh
        if layout.weight_layout == "head_groups":
            # Rows over every device as in `megatron`; attention over (row blocks, KV head groups).
            mesh = head_group_mesh(mesh, model.config.num_key_value_heads, layout.copies)
        tpu = on_tpu(mesh)
        # bf16 partial sums cross the interconnect at half the bytes; XLA CPU widens a bf16-output dot to an
        # fp32 one and is slower for it. The bitcast cache write keeps XLA CPU from widening the whole cache
        # every token; on TPU it is a relayout copy of the cache. One bucket: every process pads to the same
        # width whatever its own longest prompt is.
        super().__init__(model, pad_id, eos_ids, buckets=(prompt_len,), max_new_tokens=max_new_tokens,
                         mesh=mesh, matmul_dtype=model.compute_dtype if tpu else jnp.float32,
                         cache_write_as_bits=not tpu, attend_bucket=attend_bucket)
        self.weight_layout = layout.weight_layout
        self.sharding = batch_sharding(mesh)  # rows over every device
        self._to_layout: dict[Any, Any] = {}  # one cast-and-reshard program per state structure

    def cache_prompt_width(self, padded_width: int, longest_prompt: int) -> int:
        """The smallest power of two (>= 64) holding the longest prompt of every process, at most the fixed
        prompt length: prompts come back padded to prompt_len (the training program's shape), while the
        KV cache skips the slots that are padding in every row. One decode program per width used."""
        if jax.process_count() > 1:  # every process must run the same program
            from jax.experimental import multihost_utils

            longest_prompt = int(np.max(multihost_utils.process_allgather(np.int32(longest_prompt))))
        width = 64
        while width < longest_prompt:
            width *= 2
        return min(width, padded_width)

    def rollout_weights_program(self, state: nnx.State) -> Any:
        """The jitted cast of `state` to the compute dtype, laid out where the weight layout puts decode's
        weights (rollout_weight_shardings); `fsdp`: the plain Sampler's cast, or None (no cast needed)."""
        if self.weight_layout != "fsdp":
            key = jax.tree.structure(state)  # one program per state structure
            if key not in self._to_layout:
                where = self.rollout_weight_shardings(state)
                self._to_layout[key] = jax.jit(self._cast_impl, out_shardings=where)
            return self._to_layout[key]
        return super().rollout_weights_program(state)

    def rollout_weight_shardings(self, state: nnx.State) -> Any:
        """Where `rollout_weights_program` puts each of `state`'s weights (weight_placement.py);
        `fsdp` leaves them where training holds them."""
        if self.weight_layout == "fsdp":
            return jax.tree.map(lambda x: x.sharding, state)
        return rollout_shardings(self.weight_layout, state, self.mesh, self.model.config)

    def decode_layout(self) -> DecodeLayout | None:
        """megatron's and head_groups' explicit decode steps (decode_layouts.py); None for fsdp (the model's
        plain step, its layout left to the partitioner)."""
        if self.weight_layout == "megatron":
            return megatron_layout(self.mesh, self._pinned(self.model.config.sharding.batch),
                                   self.matmul_dtype)
        if self.weight_layout == "head_groups":
            return head_group_layout(self.mesh, self.matmul_dtype)
        return None

    def generate(self, prompts: Sequence[Sequence[int]], rng: jax.Array | int, *args: Any,
                 **kwargs: Any) -> Any:
        if isinstance(rng, jax.Array):  # made under the training mesh: jit wants one mesh for all inputs
            whole = NamedSharding(self.mesh, PartitionSpec())
            rng = jax.device_put(rng, whole) if rng.is_fully_addressable else reshard(rng, whole)
        with self.mesh_context():
            return super().generate(prompts, rng, *args, **kwargs)

    def mesh_context(self) -> Any:
        """The mesh in context while the rollout's programs are traced and run: its own (`head_groups`
        decodes on a mesh of its own over the same devices, and jit reads output layouts against the mesh
        in context)."""
        return jax.set_mesh(self.mesh)

    def place(self, array: np.ndarray) -> jax.Array:
        """This process's rows of a host batch into the global batch, rows where the layout puts them."""
        return global_from_local_rows(array, self.mesh, self.sharding)

    def constrain(self, x: jax.Array, axes: tuple) -> jax.Array:
        """`x` (an activation or the KV cache, `axes` the model's axes for it) with its rows where the layout
        puts them."""
        if self.weight_layout == "head_groups" and axes == self.model.config.sharding.kv_cache:
            # The cache [batch, kv_heads, length, head_dim] by row blocks and KV heads, where attention reads.
            spec = PartitionSpec(("dp", "fsdp"), "tp")
            return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))
        # Rows over every device; the other dims keep the model's axes (the KV cache
        # [batch, kv_heads, length, head_dim] keeps its heads on tp), minus any axis the rows already use.
        spec = fit_spec(x.shape, rollout_axes(ALL_AXES, axes), self.mesh)
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))


def rollout_axes(batch_axes: tuple[str, ...], model_axes: tuple) -> tuple:
    """The model's axes for an activation or cache array with its batch dim replaced by the rollout's."""
    rest = tuple(None if entry in batch_axes else entry for entry in tuple(model_axes)[1:])
    return (batch_axes, *rest)
