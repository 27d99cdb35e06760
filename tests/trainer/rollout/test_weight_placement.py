"""Where each weight lives (weight_placement.py): training's placement read from the model's rules is
the one its parameters carry, and the rollout layouts' values of the same description split what their
decode steps expect, exactly or not at all. Shardings only: nothing is compiled or placed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from trainer.model import Qwen2Config, create_model
from trainer.param_sharding import param_shardings
from trainer.planner import tpu_compile as aot
from trainer.planner.tpu_specs import parse_accelerator_type
from trainer.rollout.weight_placement import (
    ALL_AXES,
    COPY_AXES,
    placement_shardings,
    rollout_shardings,
    weight_kind,
)

needs_libtpu = pytest.mark.skipif(aot.libtpu_version() is None, reason="libtpu is not installed")
CONFIG = Qwen2Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)


def _specs(shardings: nnx.State) -> dict[str, PartitionSpec]:
    return {".".join(str(p) for p in path): v.get_value().spec for path, v in nnx.to_flat_state(shardings)}


@pytest.fixture(scope="module")
def state() -> nnx.State:
    return nnx.state(create_model(CONFIG, seed=0))


@pytest.fixture(scope="module")
def chips() -> Mesh:
    """Eight v6e chips from libtpu (devices only: enough for shardings) as (dp, fsdp, tp) = (2, 2, 2)."""
    return Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-8"))).reshape(2, 2, 2), ALL_AXES)


def test_every_weight_of_the_model_has_a_kind(state):
    kinds = {".".join(str(p) for p in path): weight_kind(path) for path, _ in nnx.to_flat_state(state)}
    assert None not in kinds.values(), kinds
    assert kinds["layers.0.self_attn.q_proj.bias"] == "attn_qkv_bias" and kinds["norm.scale"] == "norm"


@needs_libtpu
def test_training_placement_is_the_rules_the_parameters_carry(state, chips):
    assert _specs(placement_shardings(state, chips, CONFIG.sharding)) == _specs(param_shardings(state, chips))


@needs_libtpu
def test_rollout_layouts_split_what_their_decode_steps_expect(state, chips):
    megatron = _specs(rollout_shardings("megatron", state, chips, CONFIG))
    every = PartitionSpec(ALL_AXES)
    assert megatron["embed_tokens"] == every  # by vocabulary, not by hidden columns
    assert megatron["lm_head.kernel"] == PartitionSpec(None, ALL_AXES)
    assert megatron["layers.0.self_attn.q_proj.kernel"] == every  # by input, as FSDP splits it
    assert megatron["layers.0.self_attn.o_proj.kernel"] == PartitionSpec(None, ALL_AXES)
    assert megatron["layers.0.mlp.gate_proj.kernel"] == PartitionSpec(None, ALL_AXES)  # intermediate columns
    assert megatron["layers.0.mlp.down_proj.kernel"] == every
    assert megatron["layers.0.self_attn.q_proj.bias"] == PartitionSpec() == megatron["norm.scale"]
    groups = _specs(rollout_shardings("head_groups", state, chips, CONFIG))
    assert groups["layers.0.self_attn.k_proj.kernel"] == PartitionSpec(None, "tp")  # a KV head's columns
    assert groups["layers.0.self_attn.o_proj.kernel"] == PartitionSpec("tp")
    # The MLP and the vocabulary over one copy's devices (fsdp, tp), whole over the copies (dp).
    assert groups["layers.0.mlp.up_proj.kernel"] == PartitionSpec(None, COPY_AXES)
    assert groups["layers.0.mlp.down_proj.kernel"] == groups["embed_tokens"] == PartitionSpec(COPY_AXES)


@needs_libtpu
def test_an_explicit_layout_refuses_a_split_that_does_not_divide(chips):
    odd = dataclasses.replace(CONFIG, vocab_size=1025)
    shapes = nnx.state(nnx.eval_shape(lambda: create_model(odd, seed=0)))
    with pytest.raises(ValueError, match=r"megatron splits embed_tokens \(1025, 64\) over 8 .*use fsdp"):
        rollout_shardings("megatron", shapes, chips, odd)
    with pytest.raises(ValueError, match="head_groups splits embed_tokens.*use megatron"):
        rollout_shardings("head_groups", shapes, chips, odd)
    fsdp = _specs(rollout_shardings("fsdp", shapes, chips, odd))  # training's placement drops the axis
    assert fsdp["embed_tokens"] == PartitionSpec(None, "fsdp")
