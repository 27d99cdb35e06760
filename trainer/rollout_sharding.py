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
- `megatron`: every kernel split over every chip, rows over every chip (megatron_layout): q/k/v, o_proj and
  the embedding as FSDP splits them, the MLP by its intermediate columns (gate/up by output, down by input),
  with every collective written out (shard_map). Each RMSNorm before q/k/v and the head rides in the
  all-reduce of the partial sums after it (r * ((scale * x) @ W)), and the MLP gathers the residual once
  and reduce-scatters its output: four collectives a layer instead of FSDP's five, and the [rows,
  intermediate] activations never cross the interconnect. `auto` (the default) picks it on TPU with
  mesh_shape auto.
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
from trainer.model import DecodeLayout, Qwen2ForCausalLM, fit_spec, matmul_output_dtype, param_shardings
from trainer.rollout import Sampler

_BATCH_AXES = {"legacy": ("dp", "fsdp", "tp"), "maxtext": ("dp",)}
WEIGHT_LAYOUTS = ("fsdp", "replicated", "tensor", "megatron")
# The mesh axes the `megatron` layout splits its weights and rows over: every device of the rollout's mesh.
_ALL_AXES = ("dp", "fsdp", "tp")


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
        elif weight_layout == "megatron":
            style = "legacy"  # rows over every device: each chip attends over its own rows' cache
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
        self._to_layout: dict[Any, Any] = {}  # one cast-and-reshard program per state structure

    def prepare_weights(self, state: nnx.State) -> nnx.State:
        if self.weight_layout == "replicated":
            return self._replicate(state)
        if self.weight_layout in ("tensor", "megatron"):
            return self.layout_program(state)(state)
        return super().prepare_weights(state)

    def layout_program(self, state: nnx.State) -> Any:
        """The jitted cast of `state` to bf16 laid out for the `tensor` or `megatron` layout (built once per
        structure)."""
        key = jax.tree.structure(state)
        if key not in self._to_layout:
            self._to_layout[key] = jax.jit(self._cast_impl, out_shardings=self.layout_shardings(state))
        return self._to_layout[key]

    def layout_shardings(self, state: nnx.State) -> nnx.State:
        """Where the `tensor` or `megatron` layout puts each of `state`'s weights (see
        tensor_parallel_shardings, megatron_shardings)."""
        if self.weight_layout == "megatron":
            return megatron_shardings(state, self.mesh)
        return tensor_parallel_shardings(state, self.mesh, self.model.config.num_key_value_heads)

    def _decode_layout(self, model: Qwen2ForCausalLM) -> DecodeLayout | None:
        if self.weight_layout != "megatron" or not self.constrain_rows:
            return None
        return megatron_layout(self.mesh, self._rows_layout(model))

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


# The `megatron` layout's weights ([in, out]; embed_tokens is [vocab, hidden]): the dim each kernel is split
# along, over every device. Norms and biases stay whole on every chip. All but the MLP's are FSDP's split.
_MEGATRON_SPLIT = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 1, "up_proj": 1,
                   "down_proj": 0, "embed_tokens": 1, "lm_head": 0}


def megatron_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """Shardings of the model's weights for the `megatron` layout, each kernel split over every device: q/k/v
    by their input, o_proj by its output, the embedding (and an untied head) by hidden columns, as FSDP
    splits them; gate/up by their output and down_proj by its input (the MLP's intermediate columns stay
    on their chip)."""

    def one(path: tuple, var: nnx.Variable) -> nnx.Variable:
        names = [str(part) for part in path]
        split = next((_MEGATRON_SPLIT[n] for n in names if n in _MEGATRON_SPLIT), None)
        axes = () if split is None or names[-1] == "bias" else (None,) * split + (_ALL_AXES,)
        if axes and var.shape[split] % mesh.size:
            raise ValueError(f"rollout.weight_layout=megatron splits {'.'.join(names)} {tuple(var.shape)} "
                             f"over {mesh.size} devices, which do not divide dim {split}; use fsdp")
        return var.replace(NamedSharding(mesh, PartitionSpec(*axes)))

    return nnx.map_state(one, state)


def megatron_layout(mesh: Mesh, rows: Any) -> DecodeLayout:
    """The `megatron` layout's decode step (weights as megatron_shardings puts them, rows over every device),
    every collective written out (shard_map). Four collectives a layer:
    - the residual stream is split by hidden columns over the devices;
    - q/k/v with the input norm folded in: RMSNorm then a matmul is r * ((scale * x) @ W), r = rsqrt(mean(x^2)
      + eps) per row, so each chip multiplies its columns of scale * x by its rows of W, and its share of
      sum(x^2) rides in the same all-reduce as the partial sums (1). Each chip keeps its own rows' heads,
      which attend over its own rows' cache;
    - the attention output is gathered (2) for o_proj, whose output columns are the chip's residual columns;
    - MLP: the residual is gathered whole (3), each chip normalises it and makes its own intermediate columns
      with gate/up, down_proj contracts them, and one reduce-scatter of the partial outputs gives each chip
      its residual columns back (4);
    - embeddings: the ids gathered, each chip looks up its columns; logits: the final norm folded in as for
      q/k/v, each chip's partial logits of every row all-reduced with its share of sum(x^2), and each chip
      keeps its own rows.
    (Left to the partitioner with sharding constraints, q/k/v and the head gathered whole weights every
    token.) The [rows, intermediate] activations never leave a chip: FSDP all-reduces them every layer."""
    axes, rows_spec, whole = _ALL_AXES, PartitionSpec(_ALL_AXES), PartitionSpec()
    n = mesh.size
    split_in, split_out = PartitionSpec(axes, None), PartitionSpec(None, axes)

    def own_rows(y: jax.Array) -> jax.Array:
        size = y.shape[0] // n
        return jax.lax.dynamic_slice_in_dim(y, jax.lax.axis_index(axes) * size, size, axis=0)

    def columns(ndim: int) -> PartitionSpec:
        return PartitionSpec(*(None,) * (ndim - 1), axes)

    def normed(x: jax.Array, scale: jax.Array, eps: float, compute: Any) -> jax.Array:
        """RMSNorm (as the model's) of a whole hidden dim."""
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
        return (scale.astype(jnp.float32) * xf).astype(compute)

    def qkv(x: jax.Array, norm: Any, dense: Sequence[Any]) -> list[jax.Array]:
        dtype, compute, hidden = matmul_output_dtype(), dense[0].compute_dtype, x.shape[-1]
        kernels = [d.kernel[...].astype(compute) for d in dense]
        widths = np.cumsum([k.shape[1] for k in kernels])[:-1]

        def local(x: jax.Array, scale: jax.Array, *kernels: jax.Array) -> jax.Array:
            xf = x.astype(jnp.float32)
            a = (scale.astype(jnp.float32) * xf).astype(compute)
            y = jnp.concatenate([jnp.dot(a, k, preferred_element_type=dtype) for k in kernels], axis=-1)
            # The squares' sum in the partial sums' dtype (bf16 on TPU: r to about 2^-9, as close as the
            # bf16 partial sums themselves), so XLA combines both into one all-reduce.
            y, sumsq = jax.lax.psum((y, jnp.sum(xf * xf, axis=-1).astype(dtype)), axes)
            r = jax.lax.rsqrt(sumsq.astype(jnp.float32) / hidden + norm.eps)[..., None]
            return own_rows(y.astype(jnp.float32) * r)

        specs = (columns(x.ndim), columns(1), *[split_in] * len(kernels))
        y = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=rows_spec)(x, norm.scale[...], *kernels)
        out = jnp.split(y, widths, axis=-1)
        return [o + d.bias[...].astype(jnp.float32) if d.bias is not None else o
                for o, d in zip(out, dense, strict=True)]

    def out(attn: jax.Array, dense: Any) -> jax.Array:
        dtype, compute = matmul_output_dtype(), dense.compute_dtype

        def local(a: jax.Array, kernel: jax.Array) -> jax.Array:
            a = jax.lax.all_gather(a, axes, axis=0, tiled=True)
            return jnp.dot(a, kernel, preferred_element_type=dtype)

        y = jax.shard_map(local, mesh=mesh, in_specs=(rows_spec, split_out), out_specs=columns(attn.ndim))(
            attn.astype(compute), dense.kernel[...].astype(compute))
        return y.astype(jnp.float32).astype(compute)

    def mlp(x: jax.Array, norm: Any, block: Any) -> jax.Array:
        dtype, compute = matmul_output_dtype(), block.down_proj.compute_dtype
        kernels = [d.kernel[...].astype(compute) for d in (block.gate_proj, block.up_proj, block.down_proj)]

        def local(x: jax.Array, scale: jax.Array, gate: jax.Array, up: jax.Array,
                  down: jax.Array) -> jax.Array:
            a = normed(jax.lax.all_gather(x, axes, axis=x.ndim - 1, tiled=True), scale, norm.eps, compute)
            g = jnp.dot(a, gate, preferred_element_type=dtype).astype(jnp.float32)
            u = jnp.dot(a, up, preferred_element_type=dtype).astype(jnp.float32)
            y = jnp.dot((jax.nn.silu(g) * u).astype(compute), down, preferred_element_type=dtype)
            return jax.lax.psum_scatter(y, axes, scatter_dimension=y.ndim - 1, tiled=True)

        y = jax.shard_map(local, mesh=mesh, in_specs=(columns(x.ndim), whole, split_out, split_out, split_in),
                          out_specs=columns(x.ndim))(x, norm.scale[...], *kernels)
        return y.astype(jnp.float32).astype(compute)

    def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
        def local(table: jax.Array, ids: jax.Array) -> jax.Array:
            return jnp.take(table, jax.lax.all_gather(ids, axes, axis=0, tiled=True), axis=0)

        return jax.shard_map(local, mesh=mesh, in_specs=(split_out, rows_spec),
                             out_specs=columns(ids.ndim + 1))(table, ids)

    def logits(x: jax.Array, norm: Any, weight: jax.Array, vocab_major: bool) -> jax.Array:
        dtype, compute, hidden = matmul_output_dtype(), weight.dtype, x.shape[-1]
        pattern = "...d,vd->...v" if vocab_major else "...d,dv->...v"

        def local(x: jax.Array, scale: jax.Array, weight: jax.Array) -> jax.Array:
            xf = x.astype(jnp.float32)
            a = (scale.astype(jnp.float32) * xf).astype(compute)
            y = jnp.einsum(pattern, a, weight.astype(compute), preferred_element_type=dtype)
            y, sumsq = jax.lax.psum((y, jnp.sum(xf * xf, axis=-1).astype(dtype)), axes)
            r = jax.lax.rsqrt(sumsq.astype(jnp.float32) / hidden + norm.eps)[..., None]
            return own_rows(y.astype(jnp.float32) * r)

        y = jax.shard_map(local, mesh=mesh, in_specs=(columns(x.ndim), columns(1),
                                                      split_out if vocab_major else split_in),
                          out_specs=rows_spec)(x, norm.scale[...], weight)
        return y

    split = NamedSharding(mesh, columns(3))
    return DecodeLayout(residual=lambda x: jax.lax.with_sharding_constraint(x, split), heads=rows, qkv=qkv,
                        out=out, mlp=mlp, embed=embed, logits=logits)


def rollout_axes(batch_axes: tuple[str, ...], model_axes: tuple) -> tuple:
    """The model's axes for an activation or cache array with its batch dim replaced by the rollout's."""
    rest = tuple(None if entry in batch_axes else entry for entry in tuple(model_axes)[1:])
    return (batch_axes, *rest)


def _on_tpu(mesh: Mesh) -> bool:
    return mesh.devices.flat[0].platform == "tpu"


def resolve_weight_layout(setting: str, mesh_shape: str, style: str, activation_layout: str, config: Any,
                          mesh: Mesh) -> str:
    """`rollout.weight_layout`: auto = megatron (the fastest per token by the planner's estimate, see
    docs/plan.md) on TPU with mesh_shape auto, legacy rows and rows activations, when the hidden and
    intermediate sizes divide over the chips; fsdp otherwise (CPU tests and tools keep their layout)."""
    if setting != "auto":
        return setting
    n = mesh.size
    fits = config.hidden_size % n == 0 and config.intermediate_size % n == 0
    megatron = (_on_tpu(mesh) and mesh_shape == "auto" and style == "legacy" and activation_layout == "rows"
                and fits)
    return "megatron" if megatron else "fsdp"


def resolve_partial_sums(setting: str, compute_dtype: Any, mesh: Mesh) -> Any:
    """`rollout.partial_sums`: auto = the compute dtype on TPU (bf16 partial sums cross the interconnect at
    half the bytes), fp32 elsewhere (XLA CPU widens a bf16-output dot to an fp32 one and is slower for it)."""
    if setting == "float32":
        return jnp.float32
    if setting == "compute" or (setting == "auto" and _on_tpu(mesh)):
        return compute_dtype
    return jnp.float32
