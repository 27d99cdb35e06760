"""The samplers draw from the softmax, checked by statistics rather than against each other.

The other sampling tests compare split sampling with the plain path under the same key (a fault both share
passes) and run on the tiny model, whose 128-token slices never take the blocked inverse-CDF search that a
production slice takes. Here synthetic logits over Qwen2.5-sized slices (151,936 tokens over 16 chips:
9,496 a chip, not a multiple of the 128-token block) are drawn from thousands of times by the plain sampler
(`sampling.sample_with_uniform`) and the split one (`split_sampling.sample_split_vocab`, 8 CPU devices), at
temperature 1 and 0.7, and the counts are held against softmax(logits / temperature) with a chi-square
test. Most of the mass sits on "spike" tokens placed where an indexing fault shows: a slice's first and
last token, both sides of a block boundary, the last (partial) block; each spike is a bin of its own and
its neighbours are background, so a token off by one moves a spike's mass into the wrong bin. The
background (a normal tail over every token, as real logits have) is binned by slice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, types
    import jax, jax.numpy as jnp, numpy as np
    from scipy.stats import chisquare
    from trainer.mesh import make_mesh
    from trainer.rollout.sampling import sample_with_uniform
    from trainer.rollout.split_sampling import sample_split_vocab

    DEVICES, WIDTH = 8, 151936 // 16   # Qwen2.5's vocabulary over a v6e-16: 9,496 tokens a chip
    VOCAB, ROWS, CALLS = DEVICES * WIDTH, 512, 8   # 4,096 draws a case
    rng = np.random.default_rng(0)
    logits = rng.normal(size=VOCAB).astype(np.float32)   # the tail
    offsets = [0, 127, 128, 5000, 9471, 9472, WIDTH - 1]  # slice edges, block edges, the partial last block
    spikes = np.asarray([s * WIDTH + o + (37 * s if o == 5000 else 0)
                         for s in range(DEVICES) for o in offsets])
    logits[spikes] = rng.uniform(7.0, 9.0, size=spikes.size)
    # Bins: each spike alone, the rest of each slice together.
    bins = np.repeat(np.arange(DEVICES) + spikes.size, WIDTH)
    bins[spikes] = np.arange(spikes.size)

    mesh = make_mesh(f"1,1,{DEVICES}")
    axes = ("dp", "fsdp", "tp")
    # rms_norm of a row of ones is itself (eps 0), so the logits are exactly the head's first column.
    hidden = 2
    x = jnp.ones((ROWS, hidden), jnp.float32)
    norm = types.SimpleNamespace(scale=jnp.ones(hidden, jnp.float32), eps=0.0)
    head = jnp.asarray(np.stack([logits, np.zeros_like(logits)], axis=1))   # [vocab, hidden]
    row = jnp.asarray(logits)
    # Arguments, not closed-over constants: a 150 MB constant folded into the program costs seconds.
    plain = jax.jit(lambda u, t, row: sample_with_uniform(jnp.broadcast_to(row, (ROWS, VOCAB)), u, t, 1.0,
                                                          top_k=0, use_top_p=False, greedy=False))
    split = jax.jit(lambda u, t, x, head: sample_split_vocab(mesh, axes, x, norm, head, True, u, t,
                                                             jnp.float32(1.0), top_k=0, use_top_p=False,
                                                             greedy=False))
    out = {}
    for name, sampler, arrays in (("plain", plain, (row,)), ("split", split, (x, head))):
        for temperature in (1.0, 0.7):
            key = jax.random.key(7)
            tokens, logprobs = [], []
            for _ in range(CALLS):
                key, sub = jax.random.split(key)
                uniform = jax.random.uniform(sub, (ROWS,), jnp.float32)
                t, lp = sampler(uniform, jnp.float32(temperature), *arrays)
                tokens.append(np.asarray(t))
                logprobs.append(np.asarray(lp))
            tokens, logprobs = np.concatenate(tokens), np.concatenate(logprobs)
            scaled = logits.astype(np.float64) / temperature
            log_softmax = scaled - scaled.max() - np.log(np.exp(scaled - scaled.max()).sum())
            expected = np.bincount(bins, weights=np.exp(log_softmax), minlength=spikes.size + DEVICES)
            expected *= tokens.size
            observed = np.bincount(bins[tokens], minlength=spikes.size + DEVICES)
            stat, p = chisquare(observed, expected)
            out[f"{name} T={temperature}"] = {
                "chi2": float(stat), "dof": int(observed.size - 1), "p": float(p),
                "min_expected": float(expected.min()),
                "logprob_error": float(np.max(np.abs(logprobs - log_softmax[tokens]))),
            }
    print(json.dumps(out))
""")

# Deterministic (fixed seeds), so this never flakes; a correct sampler's p-value is uniform over seeds, and
# 1e-3 is where chance alone would fail one seed in a thousand. The faults it exists for give p < 1e-30.
P_THRESHOLD = 1e-3


def run_sampling_stats(source_root: str | None = None) -> dict:
    """The script's figures per case ({"plain T=1.0": {"chi2", "dof", "p", ...}, ...}) on 8 CPU devices,
    with the `trainer` package of source_root (default: this checkout's) first on the path."""
    env = os.environ | {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    if source_root:
        env["PYTHONPATH"] = source_root
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, cwd=source_root, capture_output=True, text=True, timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_plain_and_split_samplers_draw_from_the_softmax():
    results = run_sampling_stats()
    assert set(results) == {"plain T=1.0", "plain T=0.7", "split T=1.0", "split T=0.7"}
    for case, r in results.items():
        assert r["min_expected"] >= 5, (case, r)  # chi-square's approximation holds
        assert r["p"] > P_THRESHOLD, (case, r)
        assert r["logprob_error"] < 1e-3, (case, r)


if __name__ == "__main__":  # python tests/trainer/test_sampling_stats.py [SOURCE_ROOT]: print the figures
    print(json.dumps(run_sampling_stats(sys.argv[1] if len(sys.argv) > 1 else None), indent=1))
