"""The trainer at the seeds' scale, read by the TPU compiler on this machine (no TPU): one table.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/plan.py [--part fit,decode,...] [--json OUT]

Needs libtpu (`pip install "jax[tpu]==<jax>"`; scripts/test installs it). Every figure is the compiler's
own analysis of the trainer's real programs (trainer/planner/plan.py): memory_analysis() per chip,
cost_analysis() flops and bytes accessed, the collectives in the compiled HLO. Takes about half an hour on
2 cores.

- fit: `qwen25_3b_v6e8_bench.yaml` on v6e-8 and `qwen25_3b_v6e16_bench.yaml` on v6e-16, every program.
  Target: every program fits with at least 25% of HBM free per chip.
- decode: one generated token on v6e-16 (3B bench) in five rollout layouts: FSDP weights with logits
  kept on their rows and bf16 partial sums (`fsdp`), `megatron` (the MLP split by its intermediate
  columns, the vocabulary sampled where it lies, four collectives a layer), `head_groups` (attention
  split by KV head, two collectives a layer)
  with one copy of the weights over all 16 chips and with a copy a host, and the default
  (`weight_layout: auto`, i.e. `head_groups` with two copies of 8 chips on this slice). Per chip: the
  bytes across HBM (trainer/planner/hbm_traffic.py) and the compiler's bytes accessed, collective bytes and
  count, the estimated time (trainer/planner/plan.py's method), beside the bandwidth floor (the chip's bf16
  weights plus its KV cache at the chip's HBM bandwidth) and the slice's floor (the least of the layouts':
  weights and cache read once over all chips). Targets: the default's upper end within 3x of its floor,
  and the default the fastest layout at both ends of the range; the estimated step beside the seeds'
  measured 10.0 s/step. (The retired layouts, `replicated`, `tensor` and the
  partitioner's own FSDP step, are priced in docs/plan.md.)
- sweep: `qwen25_7b_v4_16.yaml` on v4-16, the largest local batch whose plan fits, found the way
  `tpu-console sweep --compile-only` finds it. Target: >= 8.
- weight-count (not in the default parts): how the compiler's `bytes accessed` counts a weight one matmul
  streams, against the weight's bytes and the HBM traffic read from the HLO (trainer/planner/hbm_traffic.py),
  which prices the estimate's high end (docs/plan.md explains why it matters for comparing layouts).
- order (not in the default parts): the update on v6e-16 with the hosts' devices in host-major order (what
  the trainer uses) and in mesh_utils' topology-aware order, by the compiler's figures.
- multislice (not in the default parts): the 3B bench on 2 x v6e-16 (Multislice), every program, with the
  bytes each step sends between slices over the DCN beside the ICI figures. Target: fits with
  at least 25% of HBM free per chip, DCN bytes per step reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from trainer.config import load_config
from trainer.planner.estimate import HIGH, LOW, Range, collectives_seconds, rank
from trainer.planner.plan import build_plan, format_plan
from trainer.planner.tpu_specs import parse_accelerator_type

CONFIGS = Path(__file__).resolve().parent.parent / "trainer" / "configs"
SEEDS_V6E16_STEP_S = 10.0  # seed 000: Qwen2.5-3B, 128 sequences, full-device FSDP on v6e-16
SEEDS_V6E8_STEP_S = 15.1  # seed 000: the same on v6e-8 (15.1143 s, W&B run potc8br6)
# seed 000: 4,144.3 valid tokens/s at 10.04 s a step on v6e-16, 128 sequences: 325 tokens a sequence.
SEEDS_V6E16_MEAN_COMPLETION = 4144.308 * 10.0358 / 128
# MLLM-JAX keeps FSDP weights and gathers a bf16 copy on every chip for decode (the retired `replicated`);
# of the layouts kept, fsdp is the nearest.
SEEDS_LAYOUT = "fsdp"
BASE_SETS = ["wandb_mode=disabled"]
# Rollout layouts compared per generated token: rollout config keys, and the sampler's internal knobs.
# The default first: its row and the step estimate come out first on a slow machine.
LAYOUTS = {
    "default": {},
    # head_groups with one copy of the weights over all 16 chips, and with a copy a host (4 chips, a 2x2
    # square); the default holds two (8 chips each, a 4x2 block).
    "head_groups x1": {"weight_layout": "head_groups", "weight_copies": 1},
    "head_groups x4": {"weight_layout": "head_groups", "weight_copies": 4},
    "megatron": {"weight_layout": "megatron"},  # auto's choice where the KV heads do not divide the chips
    "fsdp": {"weight_layout": "fsdp"},  # the default before `megatron`: FSDP weights, rows, bf16 partial sums
}


# What a step's estimate needs (the default and the seeds' layout): the rest of the plan is the fit part's.
STEP_PROGRAMS = {"rollout weights", "prefill", "decode step", "update"}


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


def _decode_row(layout: str, plan) -> dict:
    """One layout's decode step per chip: the compiler's figures, the floor and the range, at the expected
    decode length (the config's maximum here: the benchmark has no history)."""
    g = plan.tpu.generation
    step = next(p for p in plan.programs if p.name == "decode step")
    c = step.compiled
    return {
        "layout": layout,
        "weight_layout": plan.weight_layout,
        "hbm_bytes": c.bytes_accessed,
        "hbm_traffic_bytes": c.hbm_traffic_bytes,
        "floor_bytes": step.floor_bytes,
        "floor_s": step.floor_bytes / g.hbm_bandwidth,
        "collective_bytes": c.collectives.bytes,
        "collectives": c.collectives.count,
        # The range's parts: the collectives alone at either end, the HBM traffic the HLO counts, and the
        # high end's HBM time (that traffic or the floor times what a chip was measured to take, the larger).
        "collective_s": [collectives_seconds(c.collectives.grouped(), plan.tpu, end) for end in (LOW, HIGH)],
        "traffic_s": c.hbm_traffic_bytes / g.hbm_bandwidth,
        "hbm_high_s": max(c.hbm_traffic_bytes, step.floor_bytes * HIGH.over_floor) / g.hbm_bandwidth,
        "estimate_s": step.estimate.to_json(),
        "step_estimate": {k: v.to_json() for k, v in plan.step_estimate().items()},
    }


def decode_part(results: dict, default_plan=None, layouts: list[str] | None = None) -> None:
    tpu = parse_accelerator_type("v6e-16")
    cfg = load_config(CONFIGS / "qwen25_3b_v6e16_bench.yaml", BASE_SETS)
    rows, plans = [], {}
    for layout in layouts or LAYOUTS:
        overrides = LAYOUTS[layout]
        # The default and the seeds' own layout (weights gathered once a step) are priced as a whole step.
        only = STEP_PROGRAMS if layout in ("default", SEEDS_LAYOUT) else {"decode step"}
        plan = (
            default_plan
            if layout == "default" and default_plan is not None
            else build_plan(cfg, tpu, layout=overrides, only=only, progress=_say)
        )
        plans[layout] = plan
        rows.append(_decode_row(layout, plan))
        r = rows[-1]
        print(
            f"  {layout}: decode step {Range.from_json(r['estimate_s']).text(1e3)} ms, floor "
            f"{r['floor_s'] * 1e3:.2f} ms, {r['hbm_traffic_bytes'] / 1e9:.2f} GB across HBM "
            f"({r['hbm_bytes'] / 1e9:.2f} GB accessed by the compiler's count), {r['collectives']} "
            f"collectives; step {Range.from_json(r['step_estimate']['step_s']).text()} s",
            flush=True,
        )
    print(
        "decode, one generated token per chip, Qwen2.5-3B on v6e-16 (128 sequences, 8 per chip), the KV "
        f"cache's floor at the mean length of a {cfg.rollout.max_length_sample}-token loop:"
    )
    print(
        f"{'layout':<22}{'acc GB':>9}{'HBM GB':>9}{'floor GB':>10}{'coll MB':>10}{'#coll':>7}"
        f"{'est ms':>16}{'floor ms':>10}"
    )
    for r in rows:
        est = Range.from_json(r["estimate_s"])
        print(
            f"{r['layout']:<22}{r['hbm_bytes'] / 1e9:>9.2f}{r['hbm_traffic_bytes'] / 1e9:>9.2f}"
            f"{r['floor_bytes'] / 1e9:>10.2f}"
            f"{r['collective_bytes'] / 1e6:>10.1f}{r['collectives']:>7}{est.text(1e3):>16}"
            f"{r['floor_s'] * 1e3:>10.2f}"
        )
    by = {r["layout"]: r for r in rows}
    # The slice's floor: weights and cache read once over all its chips, the floor of a layout that holds
    # one copy split over every chip (fsdp, megatron).
    whole = [r["floor_s"] for r in rows if r["weight_layout"] in ("fsdp", "megatron")]
    slice_floor = min(whole) if whole else None
    if slice_floor:
        over = ", ".join(
            f"{r['layout']} {Range.from_json(r['estimate_s']).text(1 / slice_floor, 1)}x" for r in rows)
        print(f"the slice's floor (weights and cache read once over its chips) {slice_floor * 1e3:.2f} ms; "
              f"each range over it: {over}")
    results["decode"] = {"rows": rows, "slice_floor_s": slice_floor}
    results["_plans"] = plans
    if "default" not in by:  # a subset of layouts (--layouts): their rows only
        return
    default = Range.from_json(by["default"]["estimate_s"])
    choosable = {
        ("default (" + by["default"]["weight_layout"] + ")" if r["layout"] == "default" else r["layout"]):
        Range.from_json(r["estimate_s"])
        for r in rows
    }
    ranking = rank(choosable)
    upper = default.high / by["default"]["floor_s"]
    wins = ranking.certain and ranking.choice.startswith("default")
    print(
        f"== decode ranking of {', '.join(choosable)}: {ranking.text()}; the default is "
        + ("the fastest at both ends (PASS)" if wins else "not the fastest at both ends (FAIL)")
    )
    coll = Range(*by["default"]["collective_s"])
    print(
        f"== decode, default: the upper end {default.high * 1e3:.2f} ms is {upper:.2f}x the floor "
        f"{by['default']['floor_s'] * 1e3:.2f} ms ({'PASS' if upper <= 3 else 'FAIL'}, target <= 3x); of "
        f"the range, {by['default']['collectives']} collectives {coll.text(1e3)} ms, HBM "
        f"{by['default']['floor_s'] * 1e3:.2f}..{by['default']['hbm_high_s'] * 1e3:.2f} ms (the floor .. "
        f"{HIGH.over_floor}x it, as measured on a GPU; the HLO's traffic "
        f"{by['default']['traffic_s'] * 1e3:.2f} ms)"
        + (f"; against the slice's floor {slice_floor * 1e3:.2f} ms, {default.high / slice_floor:.2f}x"
           if slice_floor else "")
    )
    est = plans["default"].step_estimate()
    print(
        f"== estimated step with the default layout: {est['step_s'].text()} s (rollout "
        f"{est['rollout_generate_s'].text()} s at {plans['default'].expected_new_tokens:.0f} tokens, the "
        f"config's maximum; update {est['update_s'].text()} s); the seeds measured {SEEDS_V6E16_STEP_S:.1f} "
        "s/step (their own trainer and layout)",
        flush=True,
    )
    mean = SEEDS_V6E16_MEAN_COMPLETION
    at_mean = plans["default"].step_estimate(mean)
    print(
        f"   at {mean:.0f} tokens (the seeds' mean completion, 4,144 valid tokens/s x 10.0 s / 128; the loop "
        f"runs to the longest row, so at least this): step {at_mean['step_s'].text()} s\n",
        flush=True,
    )
    results["decode"].update(
        {
            "ranking": ranking.__dict__,
            "default_high_over_floor": upper,
            "step_estimate": {k: v.to_json() for k, v in est.items()},
        }
    )


def calibrate_part(results: dict, slices: list[str]) -> None:
    """The kept layout closest to the seeds' (MLLM-JAX: FSDP weights, gathered into a bf16 copy for decode;
    here fsdp, without the gather) with their batch (128 sequences, up to 1024 new tokens), priced as a
    whole step beside what they measured."""
    print("calibration against the seeds (Qwen2.5-3B, 128 sequences a step, up to 1024 new tokens):")
    for tpu_type, config, measured in (
        ("v6e-16", "qwen25_3b_v6e16_bench.yaml", SEEDS_V6E16_STEP_S),
        ("v6e-8", "qwen25_3b_v6e8_bench.yaml", SEEDS_V6E8_STEP_S),
    ):
        if tpu_type not in slices:
            continue
        plan = (results.get("_plans") or {}).get(SEEDS_LAYOUT) if tpu_type == "v6e-16" else None
        if plan is None:
            plan = build_plan(
                load_config(CONFIGS / config, BASE_SETS),
                parse_accelerator_type(tpu_type),
                layout=LAYOUTS[SEEDS_LAYOUT],
                only=STEP_PROGRAMS,
                progress=_say,
            )
        line = {}
        lengths = (("maximum", float(plan.new_tokens)), ("seeds' mean", SEEDS_V6E16_MEAN_COMPLETION))
        for label, steps in lengths:
            est = plan.step_estimate(steps)
            line[label] = {k: v.to_json() for k, v in est.items()}
            print(
                f"  {tpu_type}, {SEEDS_LAYOUT} weights, decode at {steps:.0f} tokens ({label}): rollout "
                f"{est['rollout_generate_s'].text()} s, update {est['update_s'].text()} s, step "
                f"{est['step_s'].text()} s; measured {measured:.1f} s a step",
                flush=True,
            )
        results.setdefault("calibration", {})[tpu_type] = {"measured_step_s": measured, **line}
    print(flush=True)


def sweep_part(results: dict) -> None:
    from tpu_console.experiments.planning import compile_only_sweep

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
            "estimated_s": plan.programs[0].estimate.to_json(),
            "peak_bytes": plan.programs[0].peak_bytes,
        }
        print(
            f"update, {name:<11} order: coll {c.collectives.bytes / 1e6:.1f} MB in {c.collectives.count} "
            f"collectives, HBM {c.bytes_accessed / 1e9:.2f} GB, est {plan.programs[0].estimate.text(1e3, 1)} "
            f"ms, peak {plan.programs[0].peak_bytes / 2**30:.2f} GiB",
            flush=True,
        )
    results["device_order"] = rows


def weight_count_part(results: dict) -> None:
    """How the compiler's `bytes accessed` counts a weight a matmul streams: x[32, 2048] @ W[2048, 2752]
    (one chip's share of an MLP matrix split 4 ways) compiled alone for v6e, against W's bytes."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from trainer.planner.tpu_compile import compile_program, tpu_devices

    mesh = Mesh(np.array(tpu_devices(parse_accelerator_type("v6e-4"))).reshape(4), ("tp",))
    x = jax.ShapeDtypeStruct((32, 2048), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec()))
    split = NamedSharding(mesh, PartitionSpec(None, "tp"))
    w = jax.ShapeDtypeStruct((2048, 4 * 2752), jnp.bfloat16, sharding=split)
    matmul = jax.jit(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    c = compile_program("matmul", matmul, x, w)
    weight = 2048 * 2752 * 2
    ratio, traffic = c.bytes_accessed / weight, c.hbm_traffic_bytes / weight
    print(
        f"== one matmul, per chip: the compiler's bytes accessed {c.bytes_accessed / 1e6:.2f} MB = "
        f"{ratio:.2f}x W's {weight / 1e6:.2f} MB; across HBM (trainer/planner/hbm_traffic.py) "
        f"{c.hbm_traffic_bytes / 1e6:.2f} MB = {traffic:.2f}x W (W read once, x and the result)"
    )
    results["weight_count"] = {"bytes_accessed": c.bytes_accessed, "ratio": ratio,
                               "hbm_traffic_bytes": c.hbm_traffic_bytes, "traffic_ratio": traffic}


def multislice_part(results: dict, slices: int = 2) -> None:
    """The 3B bench on `slices` x v6e-16: the trainer's mesh there (data parallel across slices), every
    program's fit, and what a step sends between slices (trainer/planner/dcn.py) beside what it sends inside
    one."""
    start = time.perf_counter()
    cfg = load_config(CONFIGS / "qwen25_3b_v6e16_bench.yaml", BASE_SETS)
    plan = build_plan(cfg, parse_accelerator_type("v6e-16"), progress=_say, slices=slices)
    print(format_plan(plan), flush=True)
    worst = min((1 - p.peak_bytes / plan.hbm_bytes) for p in plan.programs if not p.compiled.oom)
    net = plan.network_step() or {}
    ok = plan.fits and worst >= 0.25 and net.get("dcn_bytes_per_chip", 0) > 0
    print(
        f"== multislice 3B bench on {slices} x v6e-16: {'PASS' if ok else 'FAIL'} (least free {worst:.0%}, "
        f"target >= 25%; DCN {net.get('dcn_bytes_per_chip', 0) / 1e9:.3f} GB a chip a step, "
        f"{Range.from_json(net.get('dcn_s')).text()} s), compiled in {time.perf_counter() - start:.0f} s\n",
        flush=True,
    )
    results["multislice"] = {"slices": slices, "fits": plan.fits, "least_free": worst, "plan": plan.to_json()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="fit,decode,calibrate,sweep")
    parser.add_argument("--layouts", default=None, help=f"decode: these layouts only ({', '.join(LAYOUTS)})")
    parser.add_argument("--slices", default="v6e-16,v6e-8", help="calibrate: these slices only")
    parser.add_argument("--json", default=None, help="also write every figure to this JSON file")
    args = parser.parse_args()
    parts = set(args.part.split(","))
    results: dict = {}
    plans = fit_part(results) if "fit" in parts else []
    if "decode" in parts:
        layouts = args.layouts.split(",") if args.layouts else None
        decode_part(results, plans[1] if len(plans) > 1 else None, layouts)
    if "calibrate" in parts:
        calibrate_part(results, args.slices.split(","))
    results.pop("_plans", None)
    if "sweep" in parts:
        sweep_part(results)
    if "order" in parts:
        order_part(results)
    if "weight-count" in parts:
        weight_count_part(results)
    if "multislice" in parts:
        multislice_part(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
