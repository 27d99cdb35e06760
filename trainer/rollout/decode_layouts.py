"""The decode steps of the explicit rollout layouts, `megatron` and `head_groups`: each a model.DecodeLayout
whose hooks write every collective out (shard_map) on weights placed as weight_placement.py says, and
sample from the vocabulary where it lies (split_sampling.py). layouts.py says when each is used.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.model import DecodeLayout, rms_norm
from trainer.rollout.split_sampling import own_rows, sample_split_vocab
from trainer.rollout.weight_placement import ALL_AXES, COPY_AXES


def megatron_layout(mesh: Mesh, rows: Any, matmul_dtype: Any) -> DecodeLayout:
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
    layer. rows: places an activation's rows over every device; matmul_dtype: the dtype of the partial sums
    the collectives carry (DecodeOptions.matmul_dtype)."""
    axes, rows_spec = ALL_AXES, PartitionSpec(ALL_AXES)
    n = mesh.size
    split_in, split_out = PartitionSpec(axes, None), PartitionSpec(None, axes)

    def columns(ndim: int) -> PartitionSpec:
        return PartitionSpec(*(None,) * (ndim - 1), axes)

    def qkv(x: jax.Array, norm: Any, dense: Sequence[Any]) -> list[jax.Array]:
        dtype, compute, hidden = matmul_dtype, dense[0].compute_dtype, x.shape[-1]
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
        dtype, compute = matmul_dtype, dense.compute_dtype

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
    mlp = functools.partial(_column_split_mlp, mesh, axes=ALL_AXES, gather=True, dtype=matmul_dtype)

    def embed(table: jax.Array, ids: jax.Array) -> jax.Array:
        def local(table: jax.Array, ids: jax.Array) -> jax.Array:
            found = _lookup_slice(table, jax.lax.all_gather(ids, axes, axis=0, tiled=True), axes)
            return jax.lax.psum_scatter(found, axes, scatter_dimension=found.ndim - 1, tiled=True)

        return jax.shard_map(local, mesh=mesh, in_specs=(split_in, rows_spec),
                             out_specs=columns(ids.ndim + 1))(table, ids)

    split = NamedSharding(mesh, columns(3))
    # The rotary tables and the mask are left where the partitioner puts them (`tables`' default).
    return DecodeLayout(residual=lambda x: jax.lax.with_sharding_constraint(x, split),
                        heads=lambda x, _: rows(x), qkv=qkv, out=out, mlp=mlp, embed=embed,
                        sample=functools.partial(sample_split_vocab, mesh, axes))


def _column_split_mlp(mesh: Mesh, x: jax.Array, norm: Any, block: Any, *, axes: tuple, gather: bool,
                      dtype: Any, copy_axes: tuple = ()) -> jax.Array:
    """DecodeLayout.mlp with the MLP split by its intermediate columns over `axes` (gate/up by output, down
    by input), whole over `copy_axes` (the axes of a layout's copies of the weights; x's rows split over
    them): the block's output x + MLP(norm(x)), whole on every chip of a copy. Each chip normalises the
    whole residual (gathered from its columns first when `gather`), makes its intermediate columns, and one
    all-reduce of down_proj's partial outputs (in `dtype`) gives every chip of the copy the sum."""
    whole, per_copy = PartitionSpec(), PartitionSpec(copy_axes or None)
    compute = block.down_proj.compute_dtype
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


def head_group_layout(mesh: Mesh, matmul_dtype: Any) -> DecodeLayout:
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
    over the hidden dim (1/kv_heads of them, not 1/devices). matmul_dtype: as megatron_layout's."""
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
        dtype, compute = matmul_dtype, dense[0].compute_dtype
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
        dtype, compute = matmul_dtype, dense.compute_dtype

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
    mlp = functools.partial(_column_split_mlp, mesh, axes=axes, gather=False, dtype=matmul_dtype,
                            copy_axes=("dp",))

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
