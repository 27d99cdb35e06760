"""The rollout of a model whose blocks are one scanned layer (trainer/scanned.py, `train.scan_layers`).

`StackedWeightsSampler` keeps the weights stacked: `rollout_weights_program` casts them to the compute dtype
and lays out each block's as the rollout layout lays out one block's weights, the layer axis whole
(`one_block_view`, then `restacked`). Its prefill and decode are the ScannedQwen2's, which scan over the
stacked weights and a stacked KV cache; every DecodeLayout hook (megatron's and head_groups' shard_maps
included) runs inside the scan's body on that layer's weights.
"""

from __future__ import annotations

from typing import Any

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from trainer.rollout.sharded import ShardedSampler


def _as_state(pure: dict, template: nnx.State) -> nnx.State:
    out = jax.tree.map(lambda x: x, template)  # a copy of the template's structure
    nnx.replace_by_pure_dict(out, pure)
    return out


def one_block_view(state: nnx.State) -> nnx.State:
    """`state` (a scanned model's) with its stacked block's weights as ShapeDtypeStructs of one block (the
    layer axis dropped): what a per-block placement reads; the other weights as they are."""
    pure = state.to_pure_dict()
    pure["layers"] = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), pure["layers"])
    return _as_state(pure, state)


def restacked(shardings: nnx.State) -> nnx.State:
    """The shardings of `one_block_view`'s state given back the layer axis, whole, on the block's weights."""

    def whole_layers(sharding: Any) -> Any:
        if isinstance(sharding, NamedSharding):
            return NamedSharding(sharding.mesh, PartitionSpec(None, *sharding.spec))
        return sharding  # one device: the same

    pure = shardings.to_pure_dict()
    pure["layers"] = jax.tree.map(whole_layers, pure["layers"])
    return _as_state(pure, shardings)


# The rollout layouts whose scanned prefill and decode keep their layer loop rolled (one block's program);
# fsdp has the compiler unroll it (StackedWeightsSampler).
ROLLED_LAYOUTS = frozenset({"megatron", "head_groups"})


class StackedWeightsSampler(ShardedSampler):
    """ShardedSampler for a ScannedQwen2: prefill and decode scan over the stacked weights and a stacked KV
    cache (ScannedQwen2's `_prefill_layers` / `_decode_layers`), under the same layouts and DecodeLayout
    hooks as the unrolled model's. `rollout_weights_program` casts the stacked weights to the compute dtype
    and lays each block's out where the weight layout puts an unrolled block's, the layer axis whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The layer loop stays a loop where the decode step writes its collectives out (DecodeLayout hooks);
        # where the partitioner lays out split weights (fsdp), XLA unrolls it: inside a while loop the
        # partitioner gathers each layer's FSDP weights instead of reducing partial sums (a 3B-wide proxy:
        # 831 MB of collectives a token against the unrolled step's 53 MB).
        self.roll_layers = self.weight_layout in ROLLED_LAYOUTS

    def rollout_weight_shardings(self, state: nnx.State) -> Any:
        if self.weight_layout == "fsdp":  # where training holds them, the stack included
            return super().rollout_weight_shardings(state)
        return restacked(super().rollout_weight_shardings(one_block_view(state)))
