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
- `tensor`: tensor parallel inside each host, data parallel across hosts. Decode runs on a second mesh over
  the same devices, (dp = hosts, fsdp = 1, tp = chips per host): every host holds a bf16 copy split over its
  own chips (heads, MLP columns and vocabulary on tp) and decodes its own rows. A token then costs two small
  all-reduces per layer inside a host, instead of FSDP's partial sums over every chip for every matmul, and
  each chip reads 1/chips-per-host of the weights. Key/value projections stay whole on every chip when the
  KV heads do not divide over tp (Qwen2.5 has 2), so the cache needs no gather; each chip reads the cache of
  the KV head its query heads use.
The planner measures them (`python -m trainer plan`, benchmarks/plan.py); docs/plan.md has the figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.mesh import global_from_local_rows, reshard, rollout_sharding
from trainer.model import Qwen2ForCausalLM, fit_spec, param_shardings
from trainer.rollout import Sampler

_BATCH_AXES = {"legacy": ("dp", "fsdp", "tp"), "maxtext": ("dp",)}
WEIGHT_LAYOUTS = ("fsdp", "replicated", "tensor")


class ShardedSampler(Sampler):
    """`Sampler` whose inputs are this process's rows and whose batch layout follows the sharding style."""

    def __init__(self, model: Qwen2ForCausalLM, pad_id: int, eos_ids: Sequence[int], *, prompt_len: int,
                 max_new_tokens: int, mesh: Mesh, style: str, weight_layout: str = "fsdp",
                 activation_layout: str = "rows", partial_sums: str = "auto",
                 cache_write: str = "auto") -> None:
        if weight_layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"weight_layout {weight_layout!r}: use one of {', '.join(WEIGHT_LAYOUTS)}")
        self.train_mesh = mesh
        if weight_layout == "tensor":
            # Rows split over hosts only: inside a host the chips share rows and split the model.
            mesh, style = host_tensor_mesh(mesh), "maxtext"
        # One bucket: every process pads to the same width whatever its own longest prompt is.
        super().__init__(model, pad_id, eos_ids, buckets=(prompt_len,), max_new_tokens=max_new_tokens,
                         mesh=mesh, constrain_rows=activation_layout == "rows",
                         matmul_dtype=resolve_partial_sums(partial_sums, model.compute_dtype, mesh),
                         cache_write_as_bits=cache_write == "bits"
                         or (cache_write == "auto" and not _on_tpu(mesh)))
        self.style = style
        self.weight_layout = weight_layout
        self.sharding = rollout_sharding(mesh, style)
        # Cast and gather in one program: each chip casts its shard, then the bf16 shards are gathered.
        self._replicate = jax.jit(self._cast_impl, out_shardings=NamedSharding(mesh, PartitionSpec()))
        self._to_tensor: dict[Any, Any] = {}  # one cast-and-reshard program per state structure

    def prepare_weights(self, state: nnx.State) -> nnx.State:
        if self.weight_layout == "replicated":
            return self._replicate(state)
        if self.weight_layout == "tensor":
            return self.tensor_program(state)(state)
        return super().prepare_weights(state)

    def tensor_program(self, state: nnx.State) -> Any:
        """The jitted cast of `state` to bf16 laid out for the `tensor` layout (built once per structure)."""
        key = jax.tree.structure(state)
        if key not in self._to_tensor:
            self._to_tensor[key] = jax.jit(self._cast_impl, out_shardings=self.tensor_shardings(state))
        return self._to_tensor[key]

    def tensor_shardings(self, state: nnx.State) -> nnx.State:
        """Where the `tensor` layout puts each of `state`'s weights (see tensor_parallel_shardings)."""
        return tensor_parallel_shardings(state, self.mesh, self.model.config.num_key_value_heads)

    def generate(self, prompts: Sequence[Sequence[int]], rng: jax.Array | int, *args: Any,
                 **kwargs: Any) -> Any:
        if isinstance(rng, jax.Array):  # made under the training mesh: jit wants one mesh for all inputs
            whole = NamedSharding(self.mesh, PartitionSpec())
            rng = jax.device_put(rng, whole) if rng.is_fully_addressable else reshard(rng, whole)
        with self.mesh_context():
            return super().generate(prompts, rng, *args, **kwargs)

    def mesh_context(self) -> Any:
        """The mesh in context while the rollout's programs are traced and run: its own (the `tensor`
        layout's differs from training's, and jit reads output layouts against the mesh in context)."""
        return jax.set_mesh(self.mesh)

    def place(self, array: np.ndarray) -> jax.Array:
        return global_from_local_rows(array, self.mesh, self.sharding)

    def constrain(self, x: jax.Array, axes: tuple) -> jax.Array:
        # Rows follow the rollout layout; the other dims keep the model's axes (the KV cache
        # [batch, kv_heads, length, head_dim] keeps its heads on tp), minus any axis the rows already use.
        spec = fit_spec(x.shape, rollout_axes(_BATCH_AXES[self.style], axes), self.mesh)
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))


def host_tensor_mesh(mesh: Mesh) -> Mesh:
    """The decode mesh of the `tensor` layout: `mesh`'s devices in the same order (jit wants one device order
    for the weights it reads and the arrays it is given), as (dp = hosts, fsdp = 1, tp = chips per host)."""
    flat = list(mesh.devices.flat)
    hosts = len({d.process_index for d in flat})
    per_host = len(flat) // hosts
    blocks = [flat[i:i + per_host] for i in range(0, len(flat), per_host)]
    if any(len({d.process_index for d in block}) != 1 for block in blocks):
        raise ValueError("rollout.weight_layout=tensor needs each host's devices contiguous in the mesh "
                         "(the trainer's host-major order); use weight_layout=fsdp with this device order")
    return Mesh(np.array(flat, dtype=object).reshape(hosts, 1, per_host), mesh.axis_names)


def tensor_parallel_shardings(state: nnx.State, mesh: Mesh, kv_heads: int) -> nnx.State:
    """Shardings of the model's weights on the `tensor` layout's mesh: the model's own axes (tp splits heads,
    MLP columns and the vocabulary; fsdp has size 1), except that key/value projections stay whole when the
    KV heads do not divide over tp: split by columns they would cut heads in two, and every token would
    gather them back for the cache."""
    shardings = param_shardings(state, mesh)
    if kv_heads % mesh.shape["tp"] == 0:
        return shardings
    whole = NamedSharding(mesh, PartitionSpec())

    def keep_kv_whole(path: tuple, var: nnx.Variable) -> nnx.Variable:
        return var.replace(whole) if any(str(part) in ("k_proj", "v_proj") for part in path) else var

    return nnx.map_state(keep_kv_whole, shardings)


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
