"""The rollout Sampler (trainer/rollout/sampler.py) across processes and devices: the rollout layouts.

Each process passes only its own prompts; they become one global batch (every process pads to the same
fixed length, so all of them compile the same program). A layout says three things, all chosen once by
`resolve_rollout_layout` from `rollout.weight_layout` and `rollout.sharding_style` (a `RolloutLayout`, which
the trainer records in its `start` event):
- where decode's bf16 weights live (weight_placement.py has the table; `rollout_weights_program` makes them
  from the training weights once a step),
- where the batch's rows live: `legacy` split over every device (dp, fsdp, tp), `maxtext` over dp only,
  replicated over fsdp/tp,
- how a decode step lays out its work (a model.DecodeLayout, or none: the model's plain code, the layout of
  its intermediate values left to the partitioner).

The weight layouts:
- `fsdp`: the weights where training holds them. Each chip reads 1/N of the weights a token, but every
  matmul contracts over a split dimension, so each layer all-reduces partial sums (five collectives a layer
  on TPU, and the logits' partial sums once a token). Rows as `sharding_style` says.
- `replicated`: one all-gather a step makes a full bf16 copy on every chip; decode then needs no
  collective (each chip decodes its own rows). Costs the bf16 weights' size per chip.
- `tensor`: tensor parallel inside each host, data parallel across hosts. Decode runs on a second mesh
  over the same devices, (dp = hosts, fsdp = 1, tp = chips per host): every host holds a bf16 copy split
  over its own chips (heads, MLP columns and vocabulary on tp) and decodes its own rows (`maxtext` rows on
  that mesh). The key/value projections stay whole on every chip when the KV heads do not divide over tp
  (Qwen2.5 has 2), so the cache needs no gather; each chip reads the cache of the KV head its query heads
  use. Two all-reduces a layer inside a host.
- `megatron` (megatron_layout): every weight split over every chip, rows over every chip: q/k/v by their
  input and o_proj by its output (as FSDP splits them), the MLP by its intermediate columns (gate/up by
  output, down by input), the embedding and an untied head by vocabulary. Every collective is written out
  (shard_map): the input RMSNorm rides in the all-reduce of q/k/v's partial sums, the MLP gathers the
  residual once and all-reduces its output, and each chip samples from its own slice of the vocabulary
  (split_sampling.py) instead of all-reducing the partial logits: four collectives a layer, and
  the [rows, intermediate] activations never cross the interconnect.
- `head_groups` (head_group_layout): attention split by KV head, on a second mesh over the same devices,
  (dp = copies, fsdp = devices / copies / KV heads, tp = KV heads): the slice holds `rollout.weight_copies`
  copies of the weights, each on its own block of whole hosts decoding its own rows. In a copy each chip
  holds its KV head's group of q/k/v columns and o_proj rows, whole over the hidden dim, and the residual
  is whole on every chip; the MLP, the embedding and sampling are split over the copy's chips as
  `megatron` splits them over every chip. Two collectives a layer, inside a copy (an all-gather of the
  attention output's partials, an all-reduce of the MLP's); each chip reads KV-heads/copy-chips of the
  attention weights, not 1/devices.
`auto` resolves to head_groups on TPU with one copy per 8 chips where the model's dims divide a copy's
chips (megatron where the KV heads do not), fsdp elsewhere (see resolve_rollout_layout). The planner
measures them (`python -m trainer plan`, benchmarks/plan.py); docs/plan.md has the figures.
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
    rms_norm,
)
from trainer.rollout.sampler import Sampler
from trainer.rollout.split_sampling import own_rows, sample_split_vocab
from trainer.rollout.weight_placement import ALL_AXES, COPY_AXES, rollout_shardings

_BATCH_AXES = {"legacy": ("dp", "fsdp", "tp"), "maxtext": ("dp",)}
WEIGHT_LAYOUTS = ("fsdp", "replicated", "tensor", "megatron", "head_groups")


@dataclasses.dataclass(frozen=True)
class RolloutLayout:
    """The layout a rollout decodes with, as resolve_rollout_layout chose it from the config (recorded in the
    trainer's `start` event and shown by `tpu-console runs show`)."""

    weight_layout: str  # one of WEIGHT_LAYOUTS, never `auto`
    rows: str  # where the batch's rows live: legacy = split over every device, maxtext = over dp only
    configured: str  # rollout.weight_layout as configured (`auto` or the layout itself)
    why: str  # why this layout and these rows, in a few words
    copies: int = 1  # head_groups: copies of the weights on the slice, each decoding its own rows

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# `auto`'s chips to a copy of head_groups' weights: a copy's all-reduce then spans a 4x2 block of a v5e or
# v6e torus (4 hops a phase) instead of the slice. Planned for Qwen2.5-3B (docs/plan.md): on v6e-16 two
# copies of 8 chips beat one of 16 at both ends of the range, and on v6e-8 one copy of 8 beats two of 4.
COPY_CHIPS = 8


def resolve_rollout_layout(weight_layout: str, style: str, config: Qwen2Config, mesh: Mesh, *,
                           mesh_shape: str = "auto", copies: int | str = "auto") -> RolloutLayout:
    """The rollout layout for `rollout.weight_layout`, `rollout.sharding_style` and `rollout.weight_copies`
    on `mesh` (the training mesh), the one place a layout is chosen.

    `auto`: on TPU with mesh_shape auto and sharding_style legacy, head_groups where a copy of its weights
    fits whole chips of a slice: one copy per COPY_CHIPS chips (a slice of fewer: one copy a slice), each
    copy's chips dividing the KV heads, the hidden and intermediate sizes and the vocabulary. On several
    slices (dp > 1 under mesh_shape auto) every slice holds its own copies, so decode never crosses the
    data-center network. Otherwise megatron on one slice where the dims divide its chips, fsdp elsewhere
    (CPU tests and tools included, and several slices without head_groups: megatron would split the weights
    over both). head_groups is the fastest at both ends of the planner's range (docs/plan.md, issue 26, the
    3B bench on v6e-16: two copies 1.22..1.84 ms a token, one 1.34..1.95, tensor 1.55..2.34; megatron was
    1.92..3.07 with the attention output all-reduced).
    `copies` (rollout.weight_copies): `auto` as above for head_groups (configured or chosen), else a number
    of copies for head_groups (1 for any other layout: refused with another layout configured, not used
    where `auto` chose another).
    Rows: `sharding_style` for fsdp and replicated; the other layouts place rows themselves (tensor over
    hosts only, megatron and head_groups over every device), and `why` says so when that is not the
    configured style."""
    if weight_layout != "auto" and weight_layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"weight_layout {weight_layout!r}: use auto or one of {', '.join(WEIGHT_LAYOUTS)}")
    if style not in _BATCH_AXES:
        raise ValueError(f"rollout.sharding_style: unknown style {style!r}; use legacy or maxtext")
    slices = mesh.shape.get("dp", 1) if mesh_shape == "auto" else 1
    auto_copies = _auto_copies(config, mesh.size, slices)
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
        elif auto_copies:
            chosen = "head_groups"
            why = (f"auto: the {config.num_key_value_heads} KV heads and the model's dims divide "
                   f"{n // auto_copies} chips")
        elif slices > 1:
            chosen, why = "fsdp", (f"auto: {slices} slices, and no head_groups copy fits a slice's "
                                   f"{n // slices} chips (megatron would cross slices every token)")
        elif left:
            chosen, why = "fsdp", f"auto: {n} chips do not divide the {' and '.join(left)}"
        else:
            chosen = "megatron"
            why = f"auto: the {config.num_key_value_heads} KV heads do not divide {n} chips (no head_groups)"
    rows = {"tensor": "maxtext", "megatron": "legacy", "head_groups": "legacy"}.get(chosen, style)
    if rows != style:
        placed = "over hosts only" if chosen == "tensor" else "over every device"
        why += f"; {chosen} places rows {placed} ({rows}), not sharding_style {style}"
    if copies == "auto":
        copies = (auto_copies or 1) if chosen == "head_groups" else 1
        how = f"one per {mesh.size // copies} chips" + (f", {copies // slices} a slice" if slices > 1 else "")
    else:
        copies, how = int(copies), ""
        if copies != 1 and chosen != "head_groups":
            if weight_layout != "auto":
                raise ValueError(f"rollout.weight_copies={copies} is for weight_layout head_groups, not "
                                 f"{chosen}; set rollout.weight_copies=1")
            # `auto` chose another layout here (a TPU config run on CPU, say): the copies do not apply.
            why += f"; rollout.weight_copies={copies} not used (it is for head_groups)"
            copies = 1
    if copies != 1:
        per_copy, left_over = divmod(mesh.size, copies)
        if left_over or per_copy % config.num_key_value_heads:
            raise ValueError(f"rollout.weight_copies={copies} does not give each copy a whole number of "
                             f"chips for the {config.num_key_value_heads} KV heads on {mesh.size} chips; use "
                             f"a divisor of {mesh.size // config.num_key_value_heads}")
        why += f"; {copies} copies of the weights, {per_copy} chips each" + (f" ({how})" if how else "")
    return RolloutLayout(chosen, rows, weight_layout, why, copies)


def _auto_copies(config: Qwen2Config, chips: int, slices: int) -> int | None:
    """head_groups' copies under `auto`: one per COPY_CHIPS chips where a slice's chips hold whole copies,
    else one a slice; None where a copy's chips would not divide the KV heads, the hidden and intermediate
    sizes and the vocabulary (no head_groups)."""
    per_slice = chips // slices
    options = (COPY_CHIPS, per_slice) if per_slice % COPY_CHIPS == 0 else (per_slice,)
    dims = (config.hidden_size, config.intermediate_size, config.vocab_size)
    for per_copy in options:
        if per_copy % config.num_key_value_heads == 0 and all(d % per_copy == 0 for d in dims):
            return chips // per_copy
    return None


class ShardedSampler(Sampler):
    """`Sampler` whose inputs are this process's rows, with the weights, rows and decode step laid out as
    its RolloutLayout says (`self.layout`)."""

    def __init__(self, model: Qwen2ForCausalLM, pad_id: int, eos_ids: Sequence[int], *, prompt_len: int,
                 max_new_tokens: int, mesh: Mesh, style: str, weight_layout: str | RolloutLayout = "fsdp",
                 mesh_shape: str = "auto", weight_copies: int | str = "auto", **options: Any) -> None:
        """weight_layout: `rollout.weight_layout` (resolved here with `style`, `mesh_shape` and
        `weight_copies` by resolve_rollout_layout), or a RolloutLayout already resolved. options: the
        Sampler's own: attend_bucket; and constrain_rows, matmul_dtype, cache_write_as_bits, which the
        layout sets (rows pinned; bf16 partial sums and a plain cache write on TPU, fp32 and a bitcast write
        elsewhere) and only benchmarks override, to rebuild the layout from before issue 16
        (benchmarks/plan.py)."""
        if isinstance(weight_layout, RolloutLayout):
            layout = weight_layout
        else:
            layout = resolve_rollout_layout(weight_layout, style, model.config, mesh, mesh_shape=mesh_shape,
                                            copies=weight_copies)
        self.layout = layout
        self.train_mesh = mesh
        if layout.weight_layout == "tensor":
            # Rows split over hosts only: inside a host the chips share rows and split the model.
            mesh = host_tensor_mesh(mesh)
        elif layout.weight_layout == "head_groups":
            # Rows over every device as in `megatron`; attention over (row blocks, KV head groups).
            mesh = head_group_mesh(mesh, model.config.num_key_value_heads, layout.copies)
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
        """The jitted cast of `state` to the compute dtype, laid out where the weight layout puts decode's
        weights (rollout_weight_shardings); `fsdp`: the plain Sampler's cast, or None (no cast needed)."""
        if self.weight_layout == "replicated":
            return self._replicate
        if self.weight_layout in ("tensor", "megatron", "head_groups"):
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

    def _decode_layout(self, model: Qwen2ForCausalLM) -> DecodeLayout | None:
        """megatron's and head_groups' explicit decode steps; None (the model's plain step) for the other
        layouts, and with constrain_rows off (the layout before issue 16, rebuilt by benchmarks only)."""
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
        """The mesh in context while the rollout's programs are traced and run: its own (the `tensor` and
        `head_groups` layouts decode on a mesh of their own over the same devices, and jit reads output
        layouts against the mesh in context)."""
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


def megatron_layout(mesh: Mesh, rows: Any) -> DecodeLayout:
    """The `megatron` layout's decode step: weights where weight_placement.MEGATRON puts them, rows over
    every device, every collective written out (shard_map). Four collectives a layer:
    - the residual stream enters a block whole on every chip (the first block: split by hidden columns, as
      the embedding leaves it) and leaves attention split by hidden columns;
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
      elsewhere sum away in a reduce-scatter to the residual's hidden columns; sampling:
      split_sampling.sample_split_vocab (one all-gather of per-slice statistics, one all-reduce of the drawn
      tokens; greedy needs only the gather).
    (Left to the partitioner with sharding constraints instead, q/k/v and the head gathered whole weights
    every token.) The [rows, intermediate] activations never leave a chip: FSDP all-reduces them every
    layer."""
    axes, rows_spec = ALL_AXES, PartitionSpec(ALL_AXES)
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
    mlp = functools.partial(_column_split_mlp, mesh, axes=ALL_AXES, gather=True)

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


def _column_split_mlp(mesh: Mesh, x: jax.Array, norm: Any, block: Any, *, axes: tuple, gather: bool,
                      copy_axes: tuple = ()) -> jax.Array:
    """DecodeLayout.mlp with the MLP split by its intermediate columns over `axes` (gate/up by output, down
    by input), whole over `copy_axes` (the axes of a layout's copies of the weights; x's rows split over
    them): the block's output x + MLP(norm(x)), whole on every chip of a copy. Each chip normalises the
    whole residual (gathered from its columns first when `gather`), makes its intermediate columns, and one
    all-reduce of down_proj's partial outputs gives every chip of the copy the sum."""
    whole, per_copy = PartitionSpec(), PartitionSpec(copy_axes or None)
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

    x_spec = PartitionSpec(*(None,) * (x.ndim - 1), axes) if gather else per_copy
    split_in, split_out = PartitionSpec(axes, None), PartitionSpec(None, axes)
    # check_vma off when gathering: the gathered x is the same on every chip, which the check cannot infer.
    return jax.shard_map(local, mesh=mesh, in_specs=(x_spec, whole, split_out, split_out, split_in),
                         out_specs=per_copy, check_vma=not gather)(x, norm.scale[...], *kernels)


def _lookup_slice(table: jax.Array, ids: jax.Array, axes: Any) -> jax.Array:
    """Embeddings of `ids` from this device's slice of a vocab-split table, zero for ids outside it: the sum
    over the devices is the whole lookup (inside a shard_map)."""
    first = jax.lax.axis_index(axes) * table.shape[0]
    local = ids - first
    inside = (local >= 0) & (local < table.shape[0])
    found = jnp.take(table, jnp.where(inside, local, 0), axis=0)
    return jnp.where(inside[..., None], found, jnp.zeros((), found.dtype))


def head_group_mesh(mesh: Mesh, kv_heads: int, copies: int = 1) -> Mesh:
    """The decode mesh of the `head_groups` layout: `mesh`'s devices in the same order (rows keep their
    devices), as (dp = copies, fsdp = devices / copies / kv_heads, tp = kv_heads): dp picks a copy of the
    weights (contiguous devices: whole hosts in the trainer's host-major order), tp a KV head's group of
    query heads, fsdp a block of the copy's rows."""
    n = mesh.size
    if n % (copies * kv_heads):
        raise ValueError(f"rollout.weight_layout=head_groups puts the model's {kv_heads} KV heads on each of "
                         f"{copies} copies of {n} devices, which they do not divide; use megatron")
    return Mesh(np.array(list(mesh.devices.flat), dtype=object).reshape(copies, n // copies // kv_heads,
                                                                         kv_heads), mesh.axis_names)


def head_group_layout(mesh: Mesh) -> DecodeLayout:
    """The `head_groups` layout's decode step on head_group_mesh: weights where weight_placement.HEAD_GROUPS
    puts them, every collective written out (shard_map). With several copies of the weights (dp > 1), each
    copy is this layout on its own chips and rows, its collectives inside the copy (over fsdp and tp), never
    across copies. Two collectives a layer:
    - the residual stream is whole on every chip of a copy (they compute the same [rows, hidden]);
    - attention: the chip (KV head h, row block g) normalises its rows and projects them with its head
      group's whole q/k/v columns (no collective), attends over its rows' cache of head h (the cache is
      split by rows and KV heads), and multiplies by its o_proj rows: a partial output for its rows. One
      all-gather of every chip's partials, summed over the head groups on each chip, gives every chip the
      whole output (1): the bytes of an all-reduce in one phase, not two (a latency-bound token pays a
      fixed cost and the group's hops a phase; docs/plan.md);
    - MLP: each chip makes its intermediate columns of the whole residual, down_proj contracts them, and
      one all-reduce gives every chip the output (2);
    - embeddings: the ids gathered, each chip looks up those in its slice of the vocabulary (zeros for the
      others), and one all-reduce sums the lookups whole on every chip; sampling: as in `megatron`
      (split_sampling.sample_split_vocab).
    Against `megatron`'s four collectives a layer, each chip reads its head group's q/k/v and o_proj whole
    over the hidden dim (1/kv_heads of them, not 1/devices)."""
    axes, whole = COPY_AXES, PartitionSpec()
    per_copy = PartitionSpec("dp")  # a copy's rows, whole on its chips
    row_axes, groups = ("dp", "fsdp"), mesh.shape["fsdp"]  # a chip's rows: its copy's, then its block

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
            a = rms_norm(own_rows(x, "fsdp", groups), scale, norm.eps, compute)
            return tuple(jnp.dot(a, k, preferred_element_type=dtype).astype(jnp.float32) for k in kernels)

        split = PartitionSpec(None, "tp")
        out = jax.shard_map(local, mesh=mesh, in_specs=(per_copy, whole, *[split] * len(kernels)),
                            out_specs=tuple(by_group(x.ndim) for _ in kernels))(x, norm.scale[...], *kernels)
        return [o + d.bias[...].astype(jnp.float32) if d.bias is not None else o
                for o, d in zip(out, dense, strict=True)]

    def out(attn: jax.Array, dense: Any) -> jax.Array:
        dtype, compute = matmul_output_dtype(), dense.compute_dtype

        def local(a: jax.Array, kernel: jax.Array) -> jax.Array:
            y = jnp.dot(a, kernel, preferred_element_type=dtype)  # its rows' share from its KV head group
            # Every chip's partials gathered, then the head groups summed here: the bytes an all-reduce of
            # the zero-padded [rows, hidden] buffer would move, in one phase (an all-gather) instead of two.
            parts = jax.lax.all_gather(y, axes, axis=0)  # [row block x KV head group, rows, hidden]
            parts = parts.reshape(groups, mesh.shape["tp"], *y.shape).astype(jnp.float32)
            return jnp.sum(parts, axis=1).reshape(groups * y.shape[0], *y.shape[1:])

        # check_vma off: the gathered sum is the same on every chip of a copy, which the check cannot infer.
        y = jax.shard_map(local, mesh=mesh, in_specs=(by_group(attn.ndim), PartitionSpec("tp", None)),
                          out_specs=per_copy, check_vma=False)(attn.astype(compute),
                                                               dense.kernel[...].astype(compute))
        return y.astype(jnp.float32).astype(compute)

    # The residual is whole on a copy's chips already.
    mlp = functools.partial(_column_split_mlp, mesh, axes=axes, gather=False, copy_axes=("dp",))

    def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
        def local(table: jax.Array, ids: jax.Array) -> jax.Array:
            found = _lookup_slice(table, jax.lax.all_gather(ids, axes, axis=0, tiled=True), axes)
            return jax.lax.psum(found, axes)

        return jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(axes, None), PartitionSpec(ALL_AXES)),
                             out_specs=per_copy)(table, ids)

    copy_rows = NamedSharding(mesh, per_copy)
    by_block = NamedSharding(mesh, PartitionSpec(row_axes))  # the rows attention reads on each chip
    return DecodeLayout(residual=lambda x: jax.lax.with_sharding_constraint(x, copy_rows), heads=heads,
                        qkv=qkv, out=out, mlp=mlp, embed=embed,
                        sample=functools.partial(sample_split_vocab, mesh, axes, copy_axes=("dp",)),
                        tables=lambda x: jax.lax.with_sharding_constraint(x, by_block))


def rollout_axes(batch_axes: tuple[str, ...], model_axes: tuple) -> tuple:
    """The model's axes for an activation or cache array with its batch dim replaced by the rollout's."""
    rest = tuple(None if entry in batch_axes else entry for entry in tuple(model_axes)[1:])
    return (batch_axes, *rest)


def _on_tpu(mesh: Mesh) -> bool:
    return mesh.devices.flat[0].platform == "tpu"
