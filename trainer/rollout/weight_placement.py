"""Where each weight lives, in training and in every rollout layout: one description, several values.

A placement is a `ShardingRules` (trainer/model.py): the mesh axes of each kind of weight, shapes [in, out]
(`embed_tokens` is [vocab, hidden]). Training's is the model's own, `config.sharding`, which the model
stamps on each parameter as it builds it (so the loader, the optimizer and the update place them by it).
A rollout layout is another value of the same description, read by `placement_shardings`:

| kind: weight | training, `fsdp` | `megatron` | `head_groups` |
| --- | --- | --- | --- |
| embed: embed_tokens [vocab, hidden] | (tp, fsdp) | vocabulary over all | vocabulary over a copy |
| attn_qkv: q/k/v [hidden, heads * dim] | (fsdp, tp) | input over all | output over tp (KV head groups) |
| attn_qkv_bias: q/k/v biases | (tp,) | whole | whole |
| attn_out: o_proj [heads * dim, hidden] | (tp, fsdp) | output over all | input over tp |
| mlp_in: gate/up [hidden, intermediate] | (fsdp, tp) | output over all | output over a copy |
| mlp_out: down [intermediate, hidden] | (tp, fsdp) | input over all | input over a copy |
| norm: every RMSNorm's scale | whole | whole | whole |
| lm_head: an untied head [hidden, vocab] | (fsdp, tp) | vocabulary over all | vocabulary over a copy |

("all": every device of the decode mesh, ALL_AXES; "a copy": the devices of one copy of the weights,
COPY_AXES, every device when the layout holds one copy (rollout.weight_copies), each copy whole on dp.)
Training's placement drops an axis that does not divide a dimension (`fit_spec`); the explicit layouts
refuse it, since their decode step (shard_map) needs every split exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from trainer.model import ShardingRules
from trainer.param_sharding import fit_spec

# Every device of the rollout's mesh, for the weights `megatron` and `head_groups` split over all of them.
ALL_AXES = ("dp", "fsdp", "tp")
_WHOLE: tuple = ()

MEGATRON = dataclasses.replace(
    ShardingRules(), embed=(ALL_AXES,), attn_qkv=(ALL_AXES,), attn_qkv_bias=_WHOLE, attn_out=(None, ALL_AXES),
    mlp_in=(None, ALL_AXES), mlp_out=(ALL_AXES,), norm=_WHOLE, lm_head=(None, ALL_AXES))
# head_groups splits one copy of the weights over (fsdp, tp) and holds `dp` copies (rollout.weight_copies;
# one copy: dp = 1, every device, as megatron).
COPY_AXES = ("fsdp", "tp")
HEAD_GROUPS = dataclasses.replace(
    ShardingRules(), embed=(COPY_AXES,), attn_qkv=(None, "tp"), attn_qkv_bias=_WHOLE, attn_out=("tp",),
    mlp_in=(None, COPY_AXES), mlp_out=(COPY_AXES,), norm=_WHOLE, lm_head=(None, COPY_AXES))

# The module names of the model (trainer/model.py) and the kind of weight each holds.
_KINDS = {"embed_tokens": "embed", "q_proj": "attn_qkv", "k_proj": "attn_qkv", "v_proj": "attn_qkv",
          "o_proj": "attn_out", "gate_proj": "mlp_in", "up_proj": "mlp_in", "down_proj": "mlp_out",
          "lm_head": "lm_head", "input_layernorm": "norm", "post_attention_layernorm": "norm", "norm": "norm"}


def weight_kind(path: tuple) -> str | None:
    """The ShardingRules field that places the weight at `path` (an nnx.State path); None: not a weight
    the rules know, kept whole."""
    names = [str(part) for part in path]
    kind = next((_KINDS[name] for name in names if name in _KINDS), None)
    if kind == "attn_qkv" and names[-1] == "bias":
        return "attn_qkv_bias"
    if kind is not None and kind != "norm" and names[-1] == "bias":
        return None  # o_proj and the MLP have no biases; kept whole if a model had one
    return kind


def placement_shardings(state: nnx.State, mesh: Mesh, rules: ShardingRules, *,
                        exact: str | None = None) -> nnx.State:
    """NamedShardings of `state`'s weights on `mesh` by `rules`. Without `exact`, an axis that does not
    divide its dimension is dropped (training's placement); with it (the layout's name), each spec is the
    rules' axes as given, and an axis that does not divide its dimension is an error naming the weight."""

    def one(path: tuple, var: nnx.Variable) -> nnx.Variable:
        kind = weight_kind(path)
        axes = getattr(rules, kind) if kind is not None else _WHOLE
        if exact is None:
            return var.replace(NamedSharding(mesh, fit_spec(var.shape, axes, mesh)))
        for dim, entry in enumerate(axes):
            names = (entry,) if isinstance(entry, str) else tuple(entry or ())
            parts = int(np.prod([mesh.shape[name] for name in names]))
            if var.shape[dim] % parts:
                fallback = "megatron" if exact == "head_groups" else "fsdp"
                raise ValueError(f"rollout.weight_layout={exact} splits {'.'.join(str(p) for p in path)} "
                                 f"{tuple(var.shape)} over {parts} devices, which do not divide dim {dim}; "
                                 f"use {fallback}")
        return var.replace(NamedSharding(mesh, PartitionSpec(*axes)))

    return nnx.map_state(one, state)


def rollout_shardings(layout: str, state: nnx.State, mesh: Mesh, config: Any) -> nnx.State:
    """Where the rollout layout `layout` puts each of `state`'s weights on its decode mesh `mesh` (the
    training mesh, or the layout's own over the same devices), `config` the model's Qwen2Config."""
    if layout == "megatron":
        return placement_shardings(state, mesh, MEGATRON, exact="megatron")
    if layout == "head_groups":
        return placement_shardings(state, mesh, HEAD_GROUPS, exact="head_groups")
    return placement_shardings(state, mesh, config.sharding)  # fsdp: training's own
