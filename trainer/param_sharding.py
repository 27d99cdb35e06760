"""Where a parameter or an activation lives on the mesh: the sharding metadata each parameter carries
(`out_sharding`, a tuple of mesh axis names per dimension: model.py's `ShardingRules`) turned into
`PartitionSpec`s and `NamedSharding`s that fit the mesh at hand. An axis the mesh lacks, or one that does not
divide a dimension, is dropped (replicated), so one table of rules serves any mesh shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Axes = tuple[str | tuple[str, ...] | None, ...]


def constrain_batch(x: jax.Array, batch_axes: Axes) -> jax.Array:
    """Rows of an activation [B, ...] over the batch axes of the mesh in context (`jax.set_mesh`); the other
    dims replicated. A no-op outside a mesh context (single-device tests, tools)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, fit_spec(x.shape, batch_axes, mesh))


def placed_abstract(model: Any, mesh: Mesh) -> Any:
    """An abstract model (shapes from nnx.eval_shape) whose every weight carries the sharding the loader
    places it with (fit_spec of its axes on `mesh`): what the planner compiles, unrolled or scanned."""
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            axes = var.get_metadata().get("out_sharding") or ()
            var.set_value(jax.ShapeDtypeStruct(var.shape, var.dtype,
                                               sharding=NamedSharding(mesh, fit_spec(var.shape, axes, mesh))))
    return model


def fit_spec(shape: Sequence[int], axes: Axes, mesh: Mesh) -> PartitionSpec:
    """PartitionSpec from axis names, dropping mesh axes the mesh lacks or that do not divide the dim."""
    entries = []
    for dim, entry in zip(shape, tuple(axes) + (None,) * (len(shape) - len(axes)), strict=False):
        names = (entry,) if isinstance(entry, str) else tuple(entry or ())
        kept, size = [], 1
        for name in names:
            if name in mesh.shape and dim % (size * mesh.shape[name]) == 0:
                kept.append(name)
                size *= mesh.shape[name]
        entries.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
    return PartitionSpec(*entries)


def param_shardings(model_or_state: Any, mesh: Mesh) -> Any:
    """A tree of NamedSharding matching the model's nnx.State (same structure as `nnx.state(model)`)."""
    state = model_or_state if isinstance(model_or_state, nnx.State) else nnx.state(model_or_state)

    def one(var: nnx.Variable) -> nnx.Variable:
        axes = var.get_metadata().get("out_sharding") or ()
        return var.replace(NamedSharding(mesh, fit_spec(var.shape, axes, mesh)))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))
