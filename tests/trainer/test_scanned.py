"""trainer/scanned.py: the update compiled with the blocks as one scanned layer holds the same state, laid out
the same way, as the Trainer's unrolled update (compiled by libtpu for a v6e 2x2, no TPU needed).

What the two programs do not share is recorded, not hidden: XLA's cost analysis counts a loop body once,
so the scanned program's flops are about one block's, and the unrolled program's temporaries grow with
its depth (the compiler prefetches and keeps later blocks' buffers) where the scanned one's are one
block's. docs/plan.md has the figures; this is why the planner does not use the scanned program yet."""

from __future__ import annotations

import pytest

from tests.trainer.launch import planning_config
from trainer import aot

needs_libtpu = pytest.mark.skipif(aot.libtpu_version() is None, reason="libtpu is not installed")


def _update(cfg, tpu, scan: bool):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from trainer.mesh import make_mesh, train_sharding
    from trainer.plan import _abstract, _abstract_model, _with_shardings, model_config_for
    from trainer.programs import training_programs
    from trainer.scanned import scanned_training

    mesh = make_mesh(cfg.mesh_shape, devices=list(aot.tpu_devices(tpu)))
    model_config, _ = model_config_for(cfg.model_path)
    if scan:
        built = scanned_training(cfg, model_config, mesh)
        step_fn, params, rest, opt_state = built.step_fn, built.params, built.rest, built.opt_state
    else:
        model = _abstract_model(model_config, cfg, mesh)
        programs = training_programs(cfg, model, mesh)
        _, params, rest = nnx.split(model, nnx.Param, ...)
        opt_state = _with_shardings(jax.eval_shape(programs.optimizer.init, params), programs.opt_shardings)
        step_fn = programs.step_fn
    r = cfg.rollout
    rows, length, layout = r.batch_size * r.n, r.global_length + r.max_length_sample, train_sharding(mesh)
    batch = {
        "input_ids": _abstract((rows, length), jnp.int32, layout),
        "attention_mask": _abstract((rows, length), jnp.int32, layout),
        "completion_mask": _abstract((rows, r.max_length_sample), jnp.float32, layout),
        "advantages": _abstract((rows,), jnp.float32, layout),
    }
    with jax.set_mesh(mesh):
        return aot.compile_program("update", step_fn.update, params, rest, opt_state, batch), params


@needs_libtpu
def test_scanned_update_holds_the_unrolled_updates_state(tmp_path, tiny_model_dir):
    import jax

    from trainer.config import load_config
    from trainer.tpu_specs import parse_accelerator_type

    cfg = load_config(planning_config(tmp_path, tiny_model_dir), [])
    tpu = parse_accelerator_type("v6e-4")
    unrolled, unrolled_params = _update(cfg, tpu, scan=False)
    scanned, scanned_params = _update(cfg, tpu, scan=True)
    # Every block's weights stacked [layers, ...], split over the chips as one block's are.
    layers = len(unrolled_params["layers"])
    stacked = jax.tree.leaves(scanned_params["layers"])
    assert all(x.shape[0] == layers for x in stacked)
    assert all(x.sharding.spec[0] is None for x in stacked)
    assert {tuple(x.sharding.spec)[1:] for x in stacked} == {
        tuple(x.sharding.spec) for x in jax.tree.leaves(unrolled_params["layers"])
    }
    # Same arguments (weights, AdamW moments, batch) and the same donated buffers, per chip, to the byte.
    assert scanned.argument_bytes == unrolled.argument_bytes
    assert scanned.alias_bytes == unrolled.alias_bytes
    assert abs(scanned.output_bytes - unrolled.output_bytes) <= 1024  # the metrics' scalars
    # Temporaries: one block's in the loop, at most the unrolled program's (a lower bound, see above).
    assert 0 < scanned.temp_bytes <= unrolled.temp_bytes
