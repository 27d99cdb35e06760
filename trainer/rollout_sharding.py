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
- `megatron`: every kernel split over every chip, rows over every chip (megatron_layout): q/k/v and o_proj
  as FSDP splits them, the MLP by its intermediate columns (gate/up by output, down by input), the
  embedding and head by vocabulary, with every collective written out (shard_map). The RMSNorm before
  q/k/v rides in the all-reduce of their partial sums (r * ((scale * x) @ W)), the MLP gathers the
  residual once and all-reduces its output, and each chip samples from its own slice of the vocabulary
  (trainer/split_sampling.py) instead of all-reducing 39 MB of partial logits a token: four collectives a
  layer and four a token, and the [rows, intermediate] activations never cross the interconnect. `auto`
  (the default) picks it on TPU with mesh_shape auto.
- `head_groups`: attention split by KV head, rows over the rest (head_group_layout), on a second mesh over
  the same devices, (dp = 1, fsdp = devices / KV heads, tp = KV heads): each chip holds its KV head's
  group of q/k/v columns and o_proj rows whole over the hidden dim, the residual is whole on every chip,
  and a layer costs two all-reduces. Each chip reads KV-heads/devices of the attention weights, not
  1/devices; the MLP, embedding and sampling are `megatron`'s.
The planner measures them (`python -m trainer plan`, benchmarks/plan.py); docs/plan.md has the figures.
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
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.mesh import global_from_local_rows, reshard, rollout_sharding
from trainer.model import (
    DecodeLayout,
    Qwen2Config,
    Qwen2ForCausalLM,
    fit_spec,
    matmul_output_dtype,
    param_shardings,
    rms_norm,
)
from trainer.rollout import Sampler
from trainer.split_sampling import own_rows, sample_split_vocab

_BATCH_AXES = {"legacy": ("dp", "fsdp", "tp"), "maxtext": ("dp",)}
WEIGHT_LAYOUTS = ("fsdp", "replicated", "tensor", "megatron", "head_groups")
# The mesh axes the `megatron` layout splits its weights and rows over: every device of the rollout's mesh.
_ALL_AXES = ("dp", "fsdp", "tp")


@dataclasses.dataclass(frozen=True)
class RolloutLayout:
    """The layout a rollout decodes with, as resolve_rollout_layout chose it from the config (recorded in the
    trainer's `start` event and shown by `tpu-console runs show`)."""

    weight_layout: str  # one of WEIGHT_LAYOUTS, never `auto`
    rows: str  # where the batch's rows live: legacy = split over every device, maxtext = over dp only
    configured: str  # rollout.weight_layout as configured (`auto` or the layout itself)
    why: str  # why this layout and these rows, in a few words

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def resolve_rollout_layout(weight_layout: str, style: str, config: Qwen2Config, mesh: Mesh, *,
                           mesh_shape: str = "auto") -> RolloutLayout:
    """The rollout layout for `rollout.weight_layout` and `rollout.sharding_style` on `mesh` (the training
    mesh), the one place a layout is chosen.

    `auto`: on TPU with mesh_shape auto and sharding_style legacy, when the hidden and intermediate sizes and
    the vocabulary divide over the chips: head_groups when the KV heads divide the chips too, else megatron;
    fsdp otherwise (CPU tests and tools included). head_groups is the faster of the two at both ends of the
    planner's range (docs/plan.md, issue 26: 1.18..4.32 ms a token against megatron's 1.39..4.63 on v6e-16
    for Qwen2.5-3B).
    Rows: `sharding_style` for fsdp and replicated; the other layouts place rows themselves (tensor over
    hosts only, megatron and head_groups over every device), and `why` says so when that is not the
    configured style."""
    if weight_layout != "auto" and weight_layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout {weight_layout!r}: use auto or one of {', '.join(WEIGHT_LAYOUTS)}")
    if style not in _BATCH_AXES:
        raise ValueError(f"rollout.sharding_style: unknown style {style!r}; use legacy or maxtext")
    chosen, why = weight_layout, "configured"
    if weight_layout == "auto":
        n = mesh.size
        sizes = {"hidden size": config.hidden_size, "intermediate size": config.intermediate_size,
                 "vocabulary": config.vocab_size}
        left = [name for name, size in sizes.items() if size % n]
        if not _on_tpu(mesh):
            chosen, why = "fsdp", "auto: not on TPU"
        elif mesh_shape != "auto":
            chosen, why = "fsdp", f"auto: mesh_shape {mesh_shape}, not auto"
        elif style != "legacy":
            chosen, why = "fsdp", f"auto: sharding_style {style} (the explicit layouts split rows everywhere)"
        elif left:
            chosen, why = "fsdp", f"auto: {n} chips do not divide the {' and '.join(left)}"
        elif n % config.num_key_value_heads == 0:
            chosen, why = "head_groups", f"auto: the {config.num_key_value_heads} KV heads divide {n} chips"
        else:
            chosen = "megatron"
            why = f"auto: the {config.num_key_value_heads} KV heads do not divide {n} chips (no head_groups)"
    rows = {"tensor": "maxtext", "megatron": "legacy", "head_groups": "legacy"}.get(chosen, style)
    if rows != style:
        placed = "over hosts only" if chosen == "tensor" else "over every device"
        why += f"; {chosen} places rows {placed} ({rows}), not sharding_style {style}"
    return RolloutLayout(chosen, rows, weight_layout, why)


class ShardedSampler(Sampler):
    """`Sampler` whose inputs are this process's rows, with the weights, rows and decode step laid out as
    its RolloutLayout says (`self.layout`)."""

    def __init__(self, model: Qwen2ForCausalLM, pad_id: int, eos_ids: Sequence[int], *, prompt_len: int,
                 max_new_tokens: int, mesh: Mesh, style: str, weight_layout: str | RolloutLayout = "fsdp",
                 mesh_shape: str = "auto", **options: Any) -> None:
        """weight_layout: `rollout.weight_layout` (resolved here with `style` and `mesh_shape` by
        resolve_rollout_layout), or a RolloutLayout already resolved. options: the Sampler's own:
        attend_bucket; and constrain_rows, matmul_dtype, cache_write_as_bits, which the layout sets
        (rows pinned; bf16 partial sums and a plain cache write on TPU, fp32 and a bitcast write elsewhere)
        and only benchmarks override, to rebuild the layout from before issue 16 (benchmarks/plan.py)."""
        if isinstance(weight_layout, RolloutLayout):
            layout = weight_layout
        else:
            layout = resolve_rollout_layout(weight_layout, style, model.config, mesh, mesh_shape=mesh_shape)
        self.layout = layout
        self.train_mesh = mesh
        if layout.weight_layout == "tensor":
            # Rows split over hosts only: inside a host the chips share rows and split the model.
            mesh = host_tensor_mesh(mesh)
        elif layout.weight_layout == "head_groups":
            # Rows over every device as in `megatron`; attention over (row blocks, KV head groups).
            mesh = head_group_mesh(mesh, model.config.num_key_value_heads)
        on_tpu = _on_tpu(mesh)
        # bf16 partial sums cross the interconnect at half the bytes; XLA CPU widens a bf16-output dot to an
        # fp32 one and is slower for it. The bitcast cache write keeps XLA CPU from widening the whole cache
        # every token; on TPU it is a relayout copy of the cache.
        options.setdefault("matmul_dtype", model.compute_dtype if on_tpu else jnp.float32)
        options.setdefault("cache_write_as_bits", not on_tpu)
        # One bucket: every process pads to the same width whatever its own longest prompt is.
        super().__init__(model, pad_id, eos_ids, buckets=(prompt_len,), max_new_tokens=max_new_tokens,
                         mesh=mesh, **options)
        self.style = layout.rows
        self.weight_layout = layout.weight_layout
        self.sharding = rollout_sharding(mesh, self.style)
        # Cast and gather in one program: each chip casts its shard, then the bf16 shards are gathered.
        self._replicate = jax.jit(self._cast_impl, out_shardings=NamedSharding(mesh, PartitionSpec()))
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
        """The jitted cast of `state` to the compute dtype, laid out as the weight layout puts decode's
        weights (rollout_weight_shardings); `fsdp`: the plain Sampler's cast, or None (no cast needed)."""
        if self.weight_layout == "replicated":
            return self._replicate
        if self.weight_layout in ("tensor", "megatron", "head_groups"):
            return self.layout_program(state)
        return super().rollout_weights_program(state)

    def rollout_weight_shardings(self, state: nnx.State) -> Any:
        """Where `rollout_weights_program` puts each of `state`'s weights."""
        if self.weight_layout == "replicated":
            return jax.tree.map(lambda _: NamedSharding(self.mesh, PartitionSpec()), state)
        if self.weight_layout in ("tensor", "megatron", "head_groups"):
            return self.layout_shardings(state)
        return jax.tree.map(lambda x: x.sharding, state)

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
        if self.weight_layout == "head_groups":
            return head_group_shardings(state, self.mesh)
        return tensor_parallel_shardings(state, self.mesh, self.model.config.num_key_value_heads)

    def _decode_layout(self, model: Qwen2ForCausalLM) -> DecodeLayout | None:
        if not self.constrain_rows:
            return None
        if self.weight_layout == "megatron":
            return megatron_layout(self.mesh, self._rows_layout(model))
        if self.weight_layout == "head_groups":
            return head_group_layout(self.mesh)
        return None

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
        if self.weight_layout == "head_groups" and axes == self.model.config.sharding.kv_cache:
            # The cache [batch, kv_heads, length, head_dim] by row blocks and KV heads, where attention reads.
            spec = PartitionSpec(("dp", "fsdp"), "tp")
            return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))
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
# along, over every device. Norms and biases stay whole on every chip. q/k/v and o_proj are split as FSDP
# splits them; the MLP by its intermediate columns; the embedding and an untied head by vocabulary.
_MEGATRON_SPLIT = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 1, "up_proj": 1,
                   "down_proj": 0, "embed_tokens": 0, "lm_head": 1}


def megatron_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """Shardings of the model's weights for the `megatron` layout, each kernel split over every device: q/k/v
    by their input and o_proj by its output, as FSDP splits them; the embedding [vocab, hidden] and an
    untied head [hidden, vocab] by vocabulary (each chip looks up and samples its own slice of it); gate/up
    by their output and down_proj by its input (the MLP's intermediate columns stay on their chip)."""

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
    - the residual stream enters a block whole on every chip and leaves attention split by hidden columns;
    - q/k/v with the input norm folded in: RMSNorm then a matmul is r * ((scale * x) @ W), r = rsqrt(mean(x^2)
      + eps) per row, so each chip multiplies its columns of scale * x by its rows of W, and its share of
      sum(x^2) rides in the same all-reduce as the three partial sums (1). Each chip keeps its own rows'
      heads, which attend over its own rows' cache;
    - the attention output is gathered (2) for o_proj, whose output columns are the chip's residual columns;
    - MLP: the residual is gathered whole (3), each chip normalises it and makes its own intermediate columns
      with gate/up, down_proj contracts them, and one all-reduce of the partial outputs gives every chip the
      block's whole output (4). (A reduce-scatter would give each chip only its columns, but the TPU
      compiler makes it an all-reduce anyway; whole, the next block's q/k/v take their columns without a
      collective and the last block's output needs no gather before the head.)
    - embeddings: the ids gathered, each chip looks up those in its slice of the vocabulary, and the zeros
      elsewhere sum away in a reduce-scatter to columns; sampling: split_sampling.sample_split_vocab (one
      all-gather of per-slice statistics, one all-reduce of the drawn tokens).
    (Left to the partitioner with sharding constraints, q/k/v and the head gathered whole weights every
    token.) The [rows, intermediate] activations never leave a chip: FSDP all-reduces them every layer."""
    axes, rows_spec = _ALL_AXES, PartitionSpec(_ALL_AXES)
    n = mesh.size
    split_in, split_out = PartitionSpec(axes, None), PartitionSpec(None, axes)

    def columns(ndim: int) -> PartitionSpec:
        return PartitionSpec(*(None,) * (ndim - 1), axes)

    def qkv(x: jax.Array, norm: Any, dense: Sequence[Any]) -> list[jax.Array]:
        dtype, compute, hidden = matmul_output_dtype(), dense[0].compute_dtype, x.shape[-1]
        kernels = [d.kernel[...].astype(compute) for d in dense]

        def local(x: jax.Array, scale: jax.Array, *kernels: jax.Array) -> tuple[jax.Array, ...]:
            xf = x.astype(jnp.float32)
            a = (scale.astype(jnp.float32) * xf).astype(compute)
            # The three partial sums and the squares' sum (in the partial sums' dtype: bf16 on TPU, r to
            # about 2^-9, as close as the bf16 partial sums themselves) in one all-reduce, as a tuple: a
            # concatenation would be one more pass over them.
            *ys, sumsq = jax.lax.psum((*(jnp.dot(a, k, preferred_element_type=dtype) for k in kernels),
                                       jnp.sum(xf * xf, axis=-1).astype(dtype)), axes)
            r = jax.lax.rsqrt(sumsq.astype(jnp.float32) / hidden + norm.eps)[..., None]
            return tuple(own_rows(y, axes, n).astype(jnp.float32) * own_rows(r, axes, n) for y in ys)

        specs = (columns(x.ndim), columns(1), *[split_in] * len(kernels))
        out = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=(rows_spec,) * len(kernels))(
            x, norm.scale[...], *kernels)
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

    # The residual arrives split by columns (from attention) and is gathered whole first. All-reduced whole,
    # not reduce-scattered to columns: the TPU compiler makes a reduce-scatter an all-reduce anyway, and a
    # whole residual spares the last layer's gather before the head (the next block's q/k/v take their
    # columns of it without a collective).
    mlp = functools.partial(_column_split_mlp, mesh, gather=True)

    def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
        def local(table: jax.Array, ids: jax.Array) -> jax.Array:
            found = _lookup_slice(table, jax.lax.all_gather(ids, axes, axis=0, tiled=True), axes)
            return jax.lax.psum_scatter(found, axes, scatter_dimension=found.ndim - 1, tiled=True)

        return jax.shard_map(local, mesh=mesh, in_specs=(split_in, rows_spec),
                             out_specs=columns(ids.ndim + 1))(table, ids)

    split = NamedSharding(mesh, columns(3))
    return DecodeLayout(residual=lambda x: jax.lax.with_sharding_constraint(x, split),
                        heads=lambda x, _: rows(x), qkv=qkv, out=out, mlp=mlp, embed=embed,
                        sample=functools.partial(sample_split_vocab, mesh, axes))


def _column_split_mlp(mesh: Mesh, x: jax.Array, norm: Any, block: Any, *, gather: bool) -> jax.Array:
    """DecodeLayout.mlp with the MLP split by its intermediate columns over every device (gate/up by output,
    down by input): the block's output x + MLP(norm(x)), whole on every chip. Each chip normalises the whole
    residual (gathered from its columns first when `gather`), makes its intermediate columns, and one
    all-reduce of down_proj's partial outputs gives every chip the sum."""
    axes, whole = _ALL_AXES, PartitionSpec()
    dtype, compute = matmul_output_dtype(), block.down_proj.compute_dtype
    kernels = [d.kernel[...].astype(compute) for d in (block.gate_proj, block.up_proj, block.down_proj)]

    def local(x: jax.Array, scale: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
        if gather:
            x = jax.lax.all_gather(x, axes, axis=x.ndim - 1, tiled=True)
        a = rms_norm(x, scale, norm.eps, compute)
        g = jnp.dot(a, gate, preferred_element_type=dtype).astype(jnp.float32)
        u = jnp.dot(a, up, preferred_element_type=dtype).astype(jnp.float32)
        y = jnp.dot((jax.nn.silu(g) * u).astype(compute), down, preferred_element_type=dtype)
        return x + jax.lax.psum(y, axes).astype(jnp.float32).astype(compute)

    x_spec = PartitionSpec(*(None,) * (x.ndim - 1), axes) if gather else whole
    split_in, split_out = PartitionSpec(axes, None), PartitionSpec(None, axes)
    # check_vma off when gathering: the gathered x is the same on every chip, which the check cannot infer.
    return jax.shard_map(local, mesh=mesh, in_specs=(x_spec, whole, split_out, split_out, split_in),
                         out_specs=whole, check_vma=not gather)(x, norm.scale[...], *kernels)


def _lookup_slice(table: jax.Array, ids: jax.Array, axes: Any) -> jax.Array:
    """Embeddings of `ids` from this device's slice of a vocab-split table, zero for ids outside it: the sum
    over the devices is the whole lookup (inside a shard_map)."""
    first = jax.lax.axis_index(axes) * table.shape[0]
    local = ids - first
    inside = (local >= 0) & (local < table.shape[0])
    found = jnp.take(table, jnp.where(inside, local, 0), axis=0)
    return jnp.where(inside[..., None], found, jnp.zeros((), found.dtype))


def head_group_mesh(mesh: Mesh, kv_heads: int) -> Mesh:
    """The decode mesh of the `head_groups` layout: `mesh`'s devices in the same order (rows keep their
    devices), as (dp = 1, fsdp = devices / kv_heads, tp = kv_heads): tp picks a KV head's group of query
    heads, fsdp a block of rows."""
    n = mesh.size
    if n % kv_heads:
        raise ValueError(f"rollout.weight_layout=head_groups puts the model's {kv_heads} KV heads on {n} "
                         f"devices, which they do not divide; use megatron")
    return Mesh(np.array(list(mesh.devices.flat), dtype=object).reshape(1, n // kv_heads, kv_heads),
                mesh.axis_names)


# The `head_groups` layout's weights ([in, out]; embed_tokens is [vocab, hidden]): the dim each kernel is
# split along and over which axes. q/k/v by their output over the KV head groups (tp), o_proj by its input
# likewise; the MLP and the embedding over every device, as `megatron` splits them.
_HEAD_GROUP_SPLIT = {"q_proj": (1, "tp"), "k_proj": (1, "tp"), "v_proj": (1, "tp"), "o_proj": (0, "tp"),
                     "gate_proj": (1, _ALL_AXES), "up_proj": (1, _ALL_AXES), "down_proj": (0, _ALL_AXES),
                     "embed_tokens": (0, _ALL_AXES), "lm_head": (1, _ALL_AXES)}


def head_group_shardings(state: nnx.State, mesh: Mesh) -> nnx.State:
    """Shardings of the model's weights for the `head_groups` layout on head_group_mesh: each chip holds
    its KV head group's q/k/v columns and o_proj rows (whole over the hidden dim) and 1/devices of the MLP
    and the embedding. Norms and biases stay whole."""

    def one(path: tuple, var: nnx.Variable) -> nnx.Variable:
        names = [str(part) for part in path]
        split = next((_HEAD_GROUP_SPLIT[n] for n in names if n in _HEAD_GROUP_SPLIT), None)
        if split is None or names[-1] == "bias":
            return var.replace(NamedSharding(mesh, PartitionSpec()))
        dim, axes = split
        parts = int(np.prod([mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,))]))
        if var.shape[dim] % parts:
            raise ValueError(f"rollout.weight_layout=head_groups splits {'.'.join(names)} "
                             f"{tuple(var.shape)} over {parts} devices, which do not divide dim {dim}; "
                             f"use megatron")
        return var.replace(NamedSharding(mesh, PartitionSpec(*(None,) * dim, axes)))

    return nnx.map_state(one, state)


def head_group_layout(mesh: Mesh) -> DecodeLayout:
    """The `head_groups` layout's decode step on head_group_mesh (weights as head_group_shardings puts them),
    every collective written out (shard_map). Two collectives a layer:
    - the residual stream is whole on every chip (every chip computes the same [rows, hidden]);
    - attention: the chip (KV head h, row block g) normalises its rows and projects them with its head
      group's whole q/k/v columns (no collective), attends over its rows' cache of head h (the cache is
      split by rows and KV heads), and multiplies by its o_proj rows: a partial output for its rows. One
      all-reduce of the [rows, hidden] buffer, each chip's partials at its rows, sums the head groups and
      gathers the row blocks at once (1);
    - MLP: each chip makes its intermediate columns of the whole residual, down_proj contracts them, and
      one all-reduce gives every chip the output (2);
    - embeddings: the ids gathered, each chip looks up its columns, which are gathered; logits: as in
      `megatron` (split_sampling.sample_split_vocab).
    Against `megatron`'s four collectives a layer, each chip reads its head group's q/k/v and o_proj whole
    over the hidden dim (1/kv_heads of them, not 1/devices)."""
    axes, whole = _ALL_AXES, PartitionSpec()
    row_axes, groups = ("dp", "fsdp"), mesh.shape["dp"] * mesh.shape["fsdp"]

    def by_group(ndim: int) -> PartitionSpec:
        """Rows over the row blocks, the last dim (q/k/v's heads) over the KV head groups."""
        return PartitionSpec(row_axes, *(None,) * (ndim - 2), "tp")

    def heads(x: jax.Array, dim: int) -> jax.Array:
        spec = PartitionSpec(row_axes, *(("tp" if d == dim else None) for d in range(1, x.ndim)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def qkv(x: jax.Array, norm: Any, dense: Sequence[Any]) -> list[jax.Array]:
        dtype, compute = matmul_output_dtype(), dense[0].compute_dtype
        kernels = [d.kernel[...].astype(compute) for d in dense]

        def local(x: jax.Array, scale: jax.Array, *kernels: jax.Array) -> tuple[jax.Array, ...]:
            a = rms_norm(own_rows(x, row_axes, groups), scale, norm.eps, compute)
            return tuple(jnp.dot(a, k, preferred_element_type=dtype).astype(jnp.float32) for k in kernels)

        split = PartitionSpec(None, "tp")
        out = jax.shard_map(local, mesh=mesh, in_specs=(whole, whole, *[split] * len(kernels)),
                            out_specs=tuple(by_group(x.ndim) for _ in kernels))(x, norm.scale[...], *kernels)
        return [o + d.bias[...].astype(jnp.float32) if d.bias is not None else o
                for o, d in zip(out, dense, strict=True)]

    def out(attn: jax.Array, dense: Any) -> jax.Array:
        dtype, compute = matmul_output_dtype(), dense.compute_dtype

        def local(a: jax.Array, kernel: jax.Array) -> jax.Array:
            y = jnp.dot(a, kernel, preferred_element_type=dtype)
            rows = y.shape[0]
            block = jnp.zeros((rows * groups, *y.shape[1:]), y.dtype)
            block = jax.lax.dynamic_update_slice_in_dim(block, y, jax.lax.axis_index(row_axes) * rows, axis=0)
            return jax.lax.psum(block, axes)

        y = jax.shard_map(local, mesh=mesh, in_specs=(by_group(attn.ndim), PartitionSpec("tp", None)),
                          out_specs=whole)(attn.astype(compute), dense.kernel[...].astype(compute))
        return y.astype(jnp.float32).astype(compute)

    mlp = functools.partial(_column_split_mlp, mesh, gather=False)  # the residual is whole already

    def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
        def local(table: jax.Array, ids: jax.Array) -> jax.Array:
            found = _lookup_slice(table, jax.lax.all_gather(ids, axes, axis=0, tiled=True), axes)
            return jax.lax.psum(found, axes)

        return jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(axes, None), PartitionSpec(axes)),
                             out_specs=whole)(table, ids)

    replicated = NamedSharding(mesh, whole)
    return DecodeLayout(residual=lambda x: jax.lax.with_sharding_constraint(x, replicated), heads=heads,
                        qkv=qkv, out=out, mlp=mlp, embed=embed,
                        sample=functools.partial(sample_split_vocab, mesh, axes))


def rollout_axes(batch_axes: tuple[str, ...], model_axes: tuple) -> tuple:
    """The model's axes for an activation or cache array with its batch dim replaced by the rollout's."""
    rest = tuple(None if entry in batch_axes else entry for entry in tuple(model_axes)[1:])
    return (batch_axes, *rest)


def _on_tpu(mesh: Mesh) -> bool:
    return mesh.devices.flat[0].platform == "tpu"
