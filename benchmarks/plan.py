"""The trainer at the seeds' scale, read by the TPU compiler on this machine (no TPU): one table.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/plan.py [--part fit,decode,...] [--json OUT]

Needs libtpu (`pip install "jax[tpu]==<jax>"`; scripts/test installs it). Every figure is the compiler's
own analysis of the trainer's real programs (trainer/plan.py): memory_analysis() per chip, cost_analysis()
flops and bytes accessed, the collectives in the compiled HLO. Takes about half an hour on 2 cores.

- fit: `qwen25_3b_v6e8_bench.yaml` on v6e-8 and `qwen25_3b_v6e16_bench.yaml` on v6e-16, every program.
  Target: every program fits with at least 25% of HBM free per chip.
- decode: one generated token on v6e-16 (3B bench) in six rollout layouts: today's (before this change:
  FSDP weights, the logits and sampling left to the partitioner, fp32 partial sums), replicated bf16
  weights, tensor parallel inside each host, FSDP weights with logits kept on their rows and bf16 partial
  sums (the default before `megatron`), head_groups (attention split by KV head, two collectives a
  layer), and the default (`weight_layout: auto`, i.e. `megatron` on this slice: the MLP split by its
  intermediate columns, the vocabulary sampled where it lies, explicit collectives). Per chip: HBM
  bytes accessed, collective bytes and count, the estimated time (trainer/plan.py's method), beside the
  bandwidth floor (the chip's bf16 weights plus its KV cache at the chip's HBM bandwidth). Target:
  today's / default >= 2 by the same method in the same run; the estimated step beside the seeds'
  measured 10.0 s/step.
- sweep: `qwen25_7b_v4_16.yaml` on v4-16, the largest local batch whose plan fits, found the way
  `tpu-console sweep --compile-only` finds it. Target: >= 8.
- weight-count (not in the default parts): how the compiler's `bytes accessed` counts a weight one matmul
  streams, against the weight's bytes (docs/plan.md explains why it matters for comparing layouts).
- order (not in the default parts): the update on v6e-16 with the hosts' devices in host-major order (what
  the trainer uses) and in mesh_utils' topology-aware order, by the compiler's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from trainer.config import load_config
from trainer.plan import build_plan, format_plan
from trainer.tpu_specs import parse_accelerator_type

CONFIGS = Path(__file__).resolve().parent.parent / "trainer" / "configs"
SEEDS_V6E16_STEP_S = 10.0  # seed 000: Qwen2.5-3B, 128 sequences, full-device FSDP on v6e-16
BASE_SETS = ["wandb_mode=disabled"]
# Rollout layouts compared per generated token (config keys under rollout.).
LAYOUTS = {
    "today": {
        "weight_layout": "fsdp",
        "activation_layout": "free",
        "partial_sums": "float32",
        "cache_write": "bits",
    },
    "replicated": {"weight_layout": "replicated"},
    "tensor": {"weight_layout": "tensor"},
    "fsdp": {"weight_layout": "fsdp"},  # the default before `megatron`: FSDP weights, rows, bf16 partial sums
    "head_groups": {"weight_layout": "head_groups"},
    "default": {},
}


def _say(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def fit_part(results: dict) -> list:
    plans = []
    for config, tpu_type in (
        ("qwen25_3b_v6e8_bench.yaml", "v6e-8"),
        ("qwen25_3b_v6e16_bench.yaml", "v6e-16"),
    ):
        start = time.perf_counter()
        plan = build_plan(
            load_config(CONFIGS / config, BASE_SETS), parse_accelerator_type(tpu_type), progress=_say
        )
        print(format_plan(plan), flush=True)
        worst = min((1 - p.peak_bytes / plan.hbm_bytes) for p in plan.programs if not p.compiled.oom)
        ok = plan.fits and worst >= 0.25
        print(
            f"== fit {config} on {tpu_type}: {'PASS' if ok else 'FAIL'} (least free {worst:.0%}, target "
            f">= 25%), compiled in {time.perf_counter() - start:.0f} s\n",
            flush=True,
        )
        results.setdefault("fit", []).append(
            {
                "config": config,
                "tpu_type": tpu_type,
                "fits": plan.fits,
                "least_free": worst,
                "plan": plan.to_json(),
            }
        )
        plans.append(plan)
    return plans


def decode_part(results: dict, default_plan=None) -> None:
    tpu = parse_accelerator_type("v6e-16")
    cfg = load_config(CONFIGS / "qwen25_3b_v6e16_bench.yaml", BASE_SETS)
    g = tpu.generation
    rows = []
    for layout, overrides in LAYOUTS.items():
        plan = (
            default_plan
            if layout == "default" and default_plan is not None
            else build_plan(cfg, tpu, layout=overrides, only={"decode step"}, progress=_say)
        )
        step = next(p for p in plan.programs if p.name == "decode step")
        c = step.compiled
        floor_bytes = plan.resident.get("rollout weights") or plan.resident["parameters"] // 2
        floor_bytes += plan.resident["KV cache"]
        rows.append(
            {
                "layout": layout,
                "hbm_bytes": c.bytes_accessed,
                "collective_bytes": c.collectives.bytes,
                "collectives": c.collectives.count,
                "estimated_s": step.estimate_s,
                "floor_s": floor_bytes / g.hbm_bandwidth,
                "floor_bytes": floor_bytes,
                "step_estimate": plan.step_estimate(),
            }
        )
    print("decode, one generated token per chip, Qwen2.5-3B on v6e-16 (128 sequences, 8 per chip):")
    print(f"{'layout':<22}{'HBM GB':>9}{'coll MB':>10}{'#coll':>7}{'est ms':>9}{'floor ms':>10}")
    for r in rows:
        print(
            f"{r['layout']:<22}{r['hbm_bytes'] / 1e9:>9.2f}"
            f"{r['collective_bytes'] / 1e6:>10.1f}{r['collectives']:>7}{r['estimated_s'] * 1e3:>9.2f}"
            f"{r['floor_s'] * 1e3:>10.2f}"
        )
    by = {r["layout"]: r for r in rows}
    ratio = by["today"]["estimated_s"] / by["default"]["estimated_s"]
    print(
        f"== decode: today's layout / default = {ratio:.2f}x per token ({'PASS' if ratio >= 2 else 'FAIL'}, "
        "target >= 2)"
    )
    if by["default"]["step_estimate"]:
        est = by["default"]["step_estimate"]
        print(
            f"== estimated step with the default layout: {est['step_s']:.2f} s (rollout "
            f"{est['rollout_generate_s']:.2f} s at {cfg.rollout.max_length_sample} tokens, update "
            f"{est['update_s']:.2f} s); the seeds measured {SEEDS_V6E16_STEP_S:.1f} s/step\n",
            flush=True,
        )
    results["decode"] = {"rows": rows, "ratio": ratio}


def sweep_part(results: dict) -> None:
    from tpu_console.experiments.plan import compile_only_sweep

    config = CONFIGS / "qwen25_7b_v4_16.yaml"
    start = time.perf_counter()
    sweep = asyncio.run(
        compile_only_sweep(config, BASE_SETS, "v4-16", "rollout.batch_size", limit=8, progress=_say)
    )
    for t in sweep.trials:
        peak = "-" if t.peak_gib is None else f"{t.peak_gib:.2f} GiB"
        print(f"  rollout.batch_size={t.value:<3} local batch {t.local_batch:<3} peak {peak:<11} {t.verdict}")
    if sweep.stopped:
        print(f"  stopped: {sweep.stopped}")
    best = sweep.largest_local_batch or 0
    print(
        f"== sweep --compile-only, Qwen2.5-7B length 2048 on v4-16: largest local batch that fits = {best} "
        f"({'PASS' if best >= 8 else 'FAIL'}, target >= 8; seed 004 found 4 on hardware), "
        f"{time.perf_counter() - start:.0f} s\n",
        flush=True,
    )
    results["sweep"] = sweep.to_json()


def order_part(results: dict) -> None:
    """Host-major device order (what the trainer uses on several hosts) against mesh_utils' topology-aware
    order, for the update (FSDP's gathers and reduce-scatters) on v6e-16, by the compiler's figures."""
    tpu = parse_accelerator_type("v6e-16")
    cfg = load_config(CONFIGS / "qwen25_3b_v6e16_bench.yaml", BASE_SETS)
    rows = {}
    for name, topology_order in (("host-major", False), ("topology", True)):
        plan = build_plan(cfg, tpu, only={"update"}, topology_order=topology_order, progress=_say)
        c = plan.programs[0].compiled
        rows[name] = {
            "collective_bytes": c.collectives.bytes,
            "collectives": c.collectives.count,
            "hbm_bytes": c.bytes_accessed,
            "estimated_s": plan.programs[0].estimate_s,
            "peak_bytes": plan.programs[0].peak_bytes,
        }
        print(
            f"update, {name:<11} order: coll {c.collectives.bytes / 1e6:.1f} MB in {c.collectives.count} "
            f"collectives, HBM {c.bytes_accessed / 1e9:.2f} GB, est {plan.programs[0].estimate_s * 1e3:.1f} "
            f"ms, peak {plan.programs[0].peak_bytes / 2**30:.2f} GiB",
            flush=True,
        )
    results["device_order"] = rows


def weight_count_part(results: dict) -> None:
    """How the compiler's `bytes accessed` counts a weight a matmul streams: x[32, 2048] @ W[2048, 2752]
    (one chip's share of an MLP matrix in the tensor layout) compiled alone for v6e, against W's bytes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from trainer.aot import compile_program, tpu_devices

    mesh = Mesh(np.array(tpu_devices(parse_accelerator_type("v6e-4"))).reshape(4), ("tp",))
    x = jax.ShapeDtypeStruct((32, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
    split = NamedSharding(mesh, PartitionSpec(None, "tp"))
    w = jax.ShapeDtypeStruct((2048, 4 * 2752), jnp.bfloat16, sharding=split)
    matmul = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    c = compile_program("matmul", matmul, x, w)
    ratio = c.bytes_accessed / (2048 * 2752 * 2)
    print(f"== one matmul's bytes accessed / its weight's bytes per chip: {ratio:.2f}x (HBM reads W once)")
    results["weight_count"] = {"bytes_accessed": c.bytes_accessed, "ratio": ratio}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="fit,decode,sweep")
    parser.add_argument("--json", default=None, help="also write every figure to this JSON file")
    args = parser.parse_args()
    parts = set(args.part.split(","))
    results: dict = {}
    plans = fit_part(results) if "fit" in parts else []
    if "decode" in parts:
        decode_part(results, plans[1] if len(plans) > 1 else None)
    if "sweep" in parts:
        sweep_part(results)
    if "order" in parts:
        order_part(results)
    if "weight-count" in parts:
        weight_count_part(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
