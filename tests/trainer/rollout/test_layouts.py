"""The rollout layouts (trainer/rollout/layouts.py, decode_layouts.py, sharded.py): megatron and head_groups
sample what FSDP weights sample, with their weights split as they say, and `auto` resolves to the layout
the config and the chips call for, with its reason."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20]]


def test_explicit_layouts_sample_what_fsdp_weights_sample(tiny_model_dir):
    # The megatron and head_groups layouts (explicit collectives, the vocabulary split over every device and
    # sampled where it lies) on a mesh using all three axes: the same greedy tokens and log-probs as FSDP
    # weights, the same sampled tokens at temperature 1 and with top-k (which gathers the logits to their
    # rows; the sampling code is shared, so megatron alone), their weights split as they say, and the same
    # greedy tokens again for a model with its own head (untied, [hidden, vocab], as Qwen2.5-7B). head_groups
    # also with two copies of the weights (rollout.weight_copies), each decoding its own rows on 4 devices.
    script = textwrap.dedent(f"""
        import dataclasses, tempfile
        import jax.numpy as jnp, numpy as np
        from flax import nnx
        from trainer.mesh import local_rows, make_mesh
        from trainer.model import create_model
        from trainer.rollout.sharded import ShardedSampler
        from trainer.weights import load_model, save_model
        # Each prompt twice (one prefill each, shared); the cache in two segments (4 new tokens, then 8).
        prompts = ({PROMPTS!r} + [[3, 4], [7], [8, 9, 10], [11, 12], [13, 14, 15, 16, 17]]) * 2
        mesh = make_mesh("2,2,2")
        model, config = load_model({str(tiny_model_dir)!r}, mesh=mesh, compute_dtype=jnp.float32)
        out = {{}}
        kv = config.num_key_value_heads
        for layout in ("fsdp", "megatron", "head_groups", "head_groups x2"):
            copies = 2 if layout.endswith("x2") else 1
            sampler = ShardedSampler(model, 0, config.eos_token_ids, prompt_len=16, max_new_tokens=8,
                                     mesh=mesh, weight_layout=layout.split()[0],
                                     weight_copies=copies, attend_bucket=4)
            out[layout] = [sampler.generate(prompts, rng=0, greedy=True),
                           sampler.generate(prompts, rng=1, temperature=1.0)]
            if not layout.startswith("head_groups"):
                out[layout].append(sampler.generate(prompts, rng=2, temperature=1.0, top_k=5))
            if layout == "fsdp":
                continue
            weights = sampler.prepare_weights(nnx.state(model))
            layer = weights["layers"][0]
            gate = layer["mlp"]["gate_proj"]["kernel"][...]
            down = layer["mlp"]["down_proj"]["kernel"][...]
            q = layer["self_attn"]["q_proj"]["kernel"][...]
            o = layer["self_attn"]["o_proj"]["kernel"][...]
            table = weights["embed_tokens"][...]
            per_copy = 8 // copies  # a copy's devices
            assert gate.sharding.shard_shape(gate.shape) == (gate.shape[0], gate.shape[1] // per_copy)
            assert down.sharding.shard_shape(down.shape) == (down.shape[0] // per_copy, down.shape[1])
            assert table.sharding.shard_shape(table.shape) == (table.shape[0] // per_copy, table.shape[1])
            if layout == "megatron":
                assert q.sharding.shard_shape(q.shape) == (q.shape[0] // 8, q.shape[1])
            else:  # a KV head's group of query heads, whole over the hidden dim
                assert dict(sampler.mesh.shape) == {{"dp": copies, "fsdp": per_copy // kv, "tp": kv}}, \
                    sampler.mesh
                assert q.sharding.shard_shape(q.shape) == (q.shape[0], q.shape[1] // kv)
                assert o.sharding.shard_shape(o.shape) == (o.shape[0] // kv, o.shape[1])
        untied = dataclasses.replace(config, tie_word_embeddings=False)
        folder = tempfile.mkdtemp()
        save_model(create_model(untied, seed=3, compute_dtype=jnp.float32), untied, folder)
        model, _ = load_model(folder, mesh=mesh, compute_dtype=jnp.float32)
        assert model.lm_head is not None
        for layout in ("fsdp", "megatron"):
            sampler = ShardedSampler(model, 0, config.eos_token_ids, prompt_len=16, max_new_tokens=8,
                                     mesh=mesh, weight_layout=layout)
            out["untied " + layout] = [sampler.generate(prompts, rng=0, greedy=True)]
        for layout, reference in (("megatron", "fsdp"), ("head_groups", "fsdp"), ("head_groups x2", "fsdp"),
                                  ("untied megatron", "untied fsdp")):
            for mine, fsdp in zip(out[layout], out[reference]):
                np.testing.assert_array_equal(local_rows(mine.completion_ids, mesh),
                                              local_rows(fsdp.completion_ids, mesh))
                np.testing.assert_allclose(local_rows(mine.logprobs, mesh), local_rows(fsdp.logprobs, mesh),
                                           atol=1e-4)
        print("ok")
    """)
    env = os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=480, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]



def test_the_rollout_layout_is_resolved_once_with_its_reason():
    # `auto` on TPU chips (libtpu's devices, nothing compiled) and on this CPU.
    import dataclasses

    from jax.sharding import Mesh

    from trainer.model import Qwen2Config
    from trainer.planner import tpu_compile as aot
    from trainer.planner.tpu_specs import parse_accelerator_type
    from trainer.rollout.layouts import resolve_rollout_layout

    config = Qwen2Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2)
    cpu = Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("dp", "fsdp", "tp"))
    chosen = resolve_rollout_layout("auto", config, cpu)
    assert (chosen.weight_layout, chosen.configured, chosen.why) == ("fsdp", "auto", "auto: not on TPU")
    with pytest.raises(ValueError, match="use auto or one of"):
        resolve_rollout_layout("sideways", config, cpu)
    with pytest.raises(ValueError, match="weight_copies=2 is for weight_layout head_groups, not fsdp"):
        resolve_rollout_layout("fsdp", config, cpu, copies=2)
    # `auto` choosing another layout (a TPU config run on CPU) leaves the copies unused and says so.
    on_cpu = resolve_rollout_layout("auto", config, cpu, copies=2)
    assert (on_cpu.weight_layout, on_cpu.copies) == ("fsdp", 1)
    assert on_cpu.why == "auto: not on TPU; rollout.weight_copies=2 not used (it is for head_groups)"
    if aot.libtpu_version() is None:
        return
    chips = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-4"))).reshape(1, 4, 1),
                 ("dp", "fsdp", "tp"))
    assert resolve_rollout_layout("auto", config, chips).to_json() == {
        "weight_layout": "head_groups", "configured": "auto",
        "why": "auto: the 2 KV heads and the model's dims divide 4 chips", "copies": 1}
    two_copies = resolve_rollout_layout("head_groups", config, chips, copies=2)
    assert two_copies.copies == 2 and two_copies.why.endswith("2 copies of the weights, 2 chips each")
    with pytest.raises(ValueError, match="weight_copies=4 does not give each copy.*use a divisor of 2"):
        resolve_rollout_layout("head_groups", config, chips, copies=4)
    three_kv = dataclasses.replace(config, num_attention_heads=6, num_key_value_heads=3)
    assert resolve_rollout_layout("auto", three_kv, chips).weight_layout == "megatron"
    odd_vocab = dataclasses.replace(config, vocab_size=1026)
    assert resolve_rollout_layout("auto", odd_vocab, chips).why == (
        "auto: 4 chips do not divide the vocabulary")
    assert resolve_rollout_layout("auto", config, chips, mesh_shape="1,4,1").weight_layout == "fsdp"
    # One copy of head_groups' weights per 8 chips: v6e-16 holds two, v6e-8 one.
    v6e16 = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-16"))).reshape(1, 16, 1),
                 ("dp", "fsdp", "tp"))
    sixteen = resolve_rollout_layout("auto", config, v6e16)
    assert (sixteen.weight_layout, sixteen.copies) == ("head_groups", 2)
    assert sixteen.why.endswith("2 copies of the weights, 8 chips each (one per 8 chips)")
    assert resolve_rollout_layout("head_groups", config, v6e16).copies == 2  # copies auto
    assert resolve_rollout_layout("auto", config, v6e16, copies=1).copies == 1
    eight = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-8"))).reshape(1, 8, 1),
                 ("dp", "fsdp", "tp"))
    assert resolve_rollout_layout("auto", config, eight).copies == 1
    # Two slices (Multislice, dp over them): a copy on each slice, so decode stays inside a slice; where no
    # copy fits a slice's chips, fsdp (megatron would split the weights over both).
    two = Mesh(np.array(aot.tpu_devices(parse_accelerator_type("v6e-4"), 2)).reshape(2, 4, 1),
               ("dp", "fsdp", "tp"))
    both = resolve_rollout_layout("auto", config, two)
    assert (both.weight_layout, both.copies) == ("head_groups", 2)
    assert both.why.endswith("2 copies of the weights, 4 chips each (one per 4 chips, 1 a slice)")
    three_kv_on_two = resolve_rollout_layout("auto", three_kv, two)
    assert three_kv_on_two.weight_layout == "fsdp" and three_kv_on_two.why.startswith("auto: 2 slices")
