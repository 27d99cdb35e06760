"""The same global batch on fewer slices: a run relaunched on N-1 of its N slices keeps `rollout.batch_size`,
so each device trains on more rows, in more micro-batches of `micro_batch_size_per_device` (gradient
accumulation, trainer/grpo.py), and one update must equal the update on N slices. Checked with the trainer's
own programs (trainer/programs.py) on the tiny model: the mesh of 2 slices of 2 devices (dp=2 over the
slices, fsdp=2 in each: what `auto` makes there) against the mesh of the one slice left (fsdp=2), in a
process with 4 CPU devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np, optax
from flax import nnx
from trainer.config import load_config
from trainer.mesh import make_mesh, reshard, train_sharding
from trainer.programs import training_programs
from trainer.weights import load_model

model_dir = sys.argv[1]
cfg = load_config(raw={
    "model_path": model_dir, "steps": 2, "mesh_shape": "auto",
    "rollout": {"batch_size": 4, "n": 4, "global_length": 16, "max_length_sample": 8},
    "train": {"learning_rate": 1e-3, "compute_dtype": "float32", "remat": False,
              "micro_batch_size_per_device": 1}})
rows, p, c = 16, 16, 8
rng = np.random.default_rng(0)
ids = rng.integers(1, 1000, (rows, p + c)).astype(np.int32)
attention = np.ones((rows, p + c), np.int32)
for r in range(rows):
    attention[r, : r % 5] = 0  # left padding of the prompt
completion = (rng.random((rows, c)) < 0.8).astype(np.float32)
batch = {"input_ids": ids, "attention_mask": attention, "completion_mask": completion,
         "advantages": rng.standard_normal(rows).astype(np.float32)}
out = {}
# 2 slices of 2 devices: dp over the slices; the one slice left: its 2 devices
meshes = (("2 slices", "2,-1,1", jax.devices()[:4]), ("1 slice", "1,-1,1", jax.devices()[:2]))
for name, shape, devices in meshes:
    mesh = make_mesh(shape, devices, num_slices=1)
    with jax.set_mesh(mesh):
        model, _ = load_model(model_dir, mesh=mesh, compute_dtype=jnp.float32)
        programs = training_programs(cfg, model, mesh)
        _, params, rest = nnx.split(model, nnx.Param, ...)
        before = [np.asarray(x) for x in jax.tree.leaves(params)]
        opt_state = programs.init_optimizer(params)
        placed = reshard({k: jnp.asarray(v) for k, v in batch.items()}, train_sharding(mesh))
        params, opt_state, metrics = programs.step_fn.update(params, rest, opt_state, placed)
        after = [np.asarray(x) for x in jax.tree.leaves(params)]
        # AdamW's first moment after one update is (1 - b1) * the gradient: the accumulated gradient itself
        mu = [np.asarray(x) for x in jax.tree.leaves(optax.tree_utils.tree_get(opt_state, "mu"))]
        out[name] = {"micro_batches": programs.step_fn.micro_batches, "mesh": dict(mesh.shape),
                     "metrics": {k: float(v) for k, v in metrics.items()},
                     "delta": [(a - b).tolist() for a, b in zip(after, before)],
                     "mu": [m.tolist() for m in mu]}
print(json.dumps(out))
"""


def test_n_minus_one_slices_with_accumulation_make_the_same_update_as_n(tmp_path, tiny_model_dir):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    n, fewer = out["2 slices"], out["1 slice"]
    assert (n["mesh"]["dp"], n["mesh"]["fsdp"], fewer["mesh"]["dp"], fewer["mesh"]["fsdp"]) == (2, 2, 1, 2)
    # 16 sequences: 4 a device in 4 micro-batches on 2 slices; 8 a device in 8 on the one left
    assert (n["micro_batches"], fewer["micro_batches"]) == (4, 8)
    for key in ("loss", "grad_norm", "entropy", "kl"):
        assert abs(n["metrics"][key] - fewer["metrics"][key]) <= 1e-5 * max(1.0, abs(n["metrics"][key])), key
    import numpy as np

    for a, b in zip(n["mu"], fewer["mu"], strict=True):  # the gradients, to float32's sums in another order
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(a).max()))
    for a, b in zip(n["delta"], fewer["delta"], strict=True):
        # the update: AdamW's first is lr * g / (|g| + eps), +-lr wherever g is not tiny; where g is within a
        # few eps of 0 that order moves it more, so the bound is 1% of the learning rate (1e-3)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
