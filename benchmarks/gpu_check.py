"""The rollout and the update measured on a real accelerator: one script for a lent NVIDIA H100 / H200.

    python benchmarks/gpu_check.py [--out DIR] [--budget-s 450] [--tiny]

Writes each result as soon as it has it (DIR/gpu_check.jsonl, one JSON object a line, and DIR/gpu_check.txt,
a readable table; DIR defaults to $OUT, else ./gpu_check_out), so a run cut short still says what it
measured. Every kind of figure is taken once at 32 rows before any is repeated at 8 and 128 rows, so a
run cut short by its budget still has each kind:

1. `env`: JAX, jaxlib, flax, torch and transformers versions, the device.
2. `hbm`: achieved HBM read bandwidth, a jitted sum over a 4 GiB bf16 array (median of 10).
3. `trainer generate` at 8, 32 and 128 rows: the Sampler (trainer/rollout/sampler.py) on the Qwen2.5-3B
   shape with random weights, bf16 compute, 256-token prompts and 256 new tokens (no row ends early):
   prefill and the decode loop compiled ahead of time, their XLA `memory_analysis()` beside the device's
   peak `memory_stats()`; ms a token of the whole generate, against the floor at the measured bandwidth
   (every bf16 weight read once a step, plus the KV cache up to the step's length, averaged over the loop).
4. `trainer decode step` (32 rows): one step of the loop alone (`decode_step_program`), ms a token, same
   floor.
5. `grpo update`: one GRPO update (trainer/programs.py `training_programs`, AdamW, one micro-batch of 8
   sequences of 512 tokens): its memory_analysis() against the peak memory_stats(), seconds, and the
   achieved FLOP/s by XLA's cost_analysis() flops (of the compiled program, and of the lowered one, before
   the GPU compiler turns matmuls into library calls) and by 6 x parameters x tokens. The update donates the
   weights, so the model is built again after it.
6. `transformers generate` at the same shapes: eager (dynamic cache) and a static cache, whose forward
   transformers compiles itself (torch.compile, on CUDA).
7. The trainer's and transformers' generate at the other row counts.

Every section guards itself: an API missing from the installed JAX (the script avoids those newer than
about jax 0.4.35 where it can) or an out-of-memory records an `error` line and the next section runs; a
section that would start after `--budget-s` records `skipped`. `--tiny` runs every section on tiny shapes
(seconds, on CPU too): tests/trainer/test_gpu_check.py runs it so the script cannot rot.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file from a checkout: the trainer package beside it
    sys.path.insert(0, str(ROOT))

FULL = {"rows": (8, 32, 128), "prompt": 256, "new": 256, "hbm_bytes": 4 << 30, "update_rows": 8,
        "step_tokens": 16}
TINY = {"rows": (2,), "prompt": 16, "new": 8, "hbm_bytes": 32 << 20, "update_rows": 2, "step_tokens": 4}


class Report:
    """Results as they come: JSON lines and a table, flushed after every line."""

    def __init__(self, out: Path, budget_s: float) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl = (out / "gpu_check.jsonl").open("w")
        self.table = (out / "gpu_check.txt").open("w")
        self.start = time.monotonic()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def add(self, section: str, **fields: Any) -> None:
        record = {"section": section, "t_s": round(self.elapsed(), 1), **fields}
        self.jsonl.write(json.dumps(record, default=str) + "\n")
        self.jsonl.flush()
        text = "  ".join(f"{k}={_fmt(v)}" for k, v in fields.items())
        line = f"{record['t_s']:7.1f}s  {section:<24} {text}"
        self.table.write(line + "\n")
        self.table.flush()
        print(line, flush=True)

    def run(self, section: str, fn: Any, *args: Any) -> Any:
        """fn(*args), its failure recorded as one line; skipped past the budget."""
        if self.elapsed() > self.budget_s:
            self.add(section, skipped=f"past the {self.budget_s:.0f} s budget")
            return None
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - every failure is a result here, and the next section runs
            self.add(section, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                     where=traceback.format_exc().strip().splitlines()[-3][:200])
            return None


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _median_s(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _memory(compiled: Any) -> dict[str, int]:
    m = compiled.memory_analysis()
    if m is None:
        return {}
    names = ("argument", "output", "alias", "temp", "generated_code")
    return {f"xla_{n}_bytes": int(getattr(m, f"{n}_size_in_bytes", 0)) for n in names}


def _peak_bytes(device: Any) -> int | None:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    return None if not stats else stats.get("peak_bytes_in_use")


def _flops(compiled: Any) -> float | None:
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older JAX: one dict per computation
        cost = cost[0] if cost else None
    return None if not cost else cost.get("flops")


# ---- sections ---------------------------------------------------------------------------------------------


def env_section(report: Report) -> Any:
    import jax

    versions = {"python": sys.version.split()[0], "jax": jax.__version__}
    for name in ("jaxlib", "flax", "optax", "torch", "transformers"):
        try:
            versions[name] = __import__(name).__version__
        except Exception as exc:  # noqa: BLE001 - a missing package is a result
            versions[name] = f"absent ({type(exc).__name__})"
    device = jax.devices()[0]
    report.add("env", backend=jax.default_backend(), device=getattr(device, "device_kind", str(device)),
               devices=len(jax.devices()), **versions)
    return device


def hbm_section(report: Report, shapes: dict) -> float:
    import jax
    import jax.numpy as jnp

    n = shapes["hbm_bytes"] // 2
    x = jnp.ones((n,), jnp.bfloat16)
    total = jax.jit(lambda a: jnp.sum(a, dtype=jnp.float32))
    total(x).block_until_ready()
    seconds = _median_s(lambda: total(x).block_until_ready(), 10)
    bandwidth = x.nbytes / seconds
    report.add("hbm", bytes=int(x.nbytes), seconds=seconds, read_GBps=bandwidth / 1e9)
    return bandwidth


def model_config(tiny: bool) -> Any:
    from trainer.model import PRESETS, Qwen2Config

    if tiny:
        return Qwen2Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return PRESETS["qwen2.5-3b"]


def weight_bytes(config: Any, itemsize: int) -> int:
    """The model's parameters at `itemsize` bytes each (embedding counted once when tied)."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    layers = config.num_hidden_layers
    q = config.num_attention_heads * config.dim_per_head
    kv = config.num_key_value_heads * config.dim_per_head
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + q + 2 * kv
    head = 0 if config.tie_word_embeddings else v * h
    return itemsize * (v * h + head + layers * per_layer + h)


def kv_bytes(config: Any, rows: int, length: float, itemsize: int = 2) -> float:
    per_slot = config.num_key_value_heads * config.dim_per_head * itemsize
    return config.num_hidden_layers * 2 * rows * length * per_slot


def floor_ms(config: Any, rows: int, shapes: dict, bandwidth: float | None) -> float | None:
    """What a decode step must read at least, at the measured bandwidth: bf16 weights once, and the KV cache
    up to the step's length (the loop's average: prompt + half the new tokens)."""
    if not bandwidth:
        return None
    length = shapes["prompt"] + shapes["new"] / 2
    return 1e3 * (weight_bytes(config, 2) + kv_bytes(config, rows, length)) / bandwidth


def make_model(config: Any) -> Any:
    import jax.numpy as jnp
    from flax import nnx

    from trainer.model import Qwen2ForCausalLM

    def build() -> Any:
        return Qwen2ForCausalLM(config, nnx.Rngs(0), param_dtype=jnp.float32, compute_dtype=jnp.bfloat16)

    if hasattr(nnx, "use_eager_sharding"):  # newer flax: no mesh here, so no sharding annotations applied
        with nnx.use_eager_sharding(False):
            return build()
    return build()


def trainer_rollout_section(report: Report, shapes: dict, config: Any, model: Any, rows: int,
                            bandwidth: float | None, device: Any, with_step: bool) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from trainer.rollout.sampler import Sampler, SamplingState

    rng = np.random.default_rng(rows)
    prompts = rng.integers(3, config.vocab_size, size=(rows, shapes["prompt"])).tolist()
    # End id -1: never drawn, so every row runs all the new tokens.
    sampler = Sampler(model, pad_id=0, eos_ids=[-1], buckets=(shapes["prompt"],),
                      max_new_tokens=shapes["new"])
    statics = {"top_k": 0, "use_top_p": False, "greedy": False}
    ids, mask = sampler.pad_prompts(prompts)
    ids, mask = jnp.asarray(ids), jnp.asarray(mask)
    lens = jnp.asarray(np.asarray(mask).sum(1).astype(np.int32))
    state = sampler.prepare_weights(nnx.state(model))
    key, one = jax.random.key(0), jnp.float32(1.0)
    start = time.perf_counter()
    prefill = sampler.prefill.lower(state, ids, mask, key, one, one, **statics).compile()
    cache, kv_mask, first, first_lp = prefill(state, ids, mask, key, one, one)
    decode = sampler.decode_loop.lower(state, cache, kv_mask, first, first_lp, lens, key, one, one,
                                   **statics).compile()
    compile_s = time.perf_counter() - start

    def generate() -> None:
        c, m, f, lp = prefill(state, ids, mask, key, one, one)
        jax.block_until_ready(decode(state, c, m, f, lp, lens, key, one, one))

    generate()
    seconds = _median_s(generate, 3)
    floor = floor_ms(config, rows, shapes, bandwidth)
    ms = 1e3 * seconds / shapes["new"]
    report.add("trainer generate", rows=rows, compile_s=compile_s, seconds=seconds, ms_per_token=ms,
               floor_ms=floor, x_floor=None if floor is None else ms / floor,
               prefill_memory=_memory(prefill), decode_loop_memory=_memory(decode),
               peak_memory_stats_bytes=_peak_bytes(device))

    if not with_step:
        return
    # One step of the loop alone, from the prefill's cache (steps 1.. as the loop runs them).
    step = sampler.decode_step_program(**statics)
    c, m, f, lp = prefill(state, ids, mask, key, one, one)
    n = shapes["new"]
    tokens = jnp.zeros((rows, n), jnp.int32).at[:, 0].set(f)
    logprobs = jnp.zeros((rows, n), jnp.float32)
    carry = SamplingState(step=jnp.int32(1), cache=c, kv_mask=m, tokens=tokens, logprobs=logprobs,
                          done=jnp.zeros((rows,), bool))
    uniforms = jax.random.uniform(key, (rows, n), jnp.float32)
    carry = jax.block_until_ready(step(state, carry, uniforms, lens, one, one))  # compiles
    times = []
    for _ in range(min(shapes["step_tokens"], n - 2)):
        begin = time.perf_counter()
        carry = jax.block_until_ready(step(state, carry, uniforms, lens, one, one))
        times.append(time.perf_counter() - begin)
    ms = 1e3 * statistics.median(times)
    report.add("trainer decode step", rows=rows, ms_per_token=ms, floor_ms=floor,
               x_floor=None if floor is None else ms / floor)


def update_section(report: Report, shapes: dict, config: Any, model: Any, device: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from trainer.config import TrainerConfig
    from trainer.mesh import make_mesh
    from trainer.planner.whole_cost import cpu_cost_analysis
    from trainer.programs import training_programs

    rows = shapes["update_rows"]
    cfg = TrainerConfig(
        model_path="random", steps=1,
        rollout={"batch_size": rows // 2, "n": 2, "global_length": shapes["prompt"],
                 "max_length_sample": shapes["new"]},
        train={"micro_batch_size_per_device": rows, "beta": 0.0, "compute_dtype": "bfloat16"},
    )
    mesh = make_mesh("1,1,1", devices=jax.devices()[:1])
    programs = training_programs(cfg, model, mesh)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = programs.init_optimizer(params)
    length = shapes["prompt"] + shapes["new"]
    rng = np.random.default_rng(0)
    batch = {
        "input_ids": jnp.asarray(rng.integers(3, config.vocab_size, size=(rows, length)), jnp.int32),
        "attention_mask": jnp.ones((rows, length), jnp.int32),
        "completion_mask": jnp.ones((rows, shapes["new"]), jnp.float32),
        "advantages": jnp.asarray(rng.normal(size=rows), jnp.float32),
    }
    start = time.perf_counter()
    lowered = programs.step_fn.update.lower(params, rest, opt_state, batch)
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    # The compiled program's count was 6.8x under 6 x N x tokens on an H100, where matmuls become library
    # calls; the lowered program (plain dots, before any rewrite) is counted by the CPU client's analysis,
    # since the GPU client's answers None for a lowered program.
    lowered_flops = cpu_cost_analysis(lowered.as_text(dialect="hlo"))[0]
    out = jax.block_until_ready(compiled(params, rest, opt_state, batch))  # donates params and opt_state
    params, opt_state = out[0], out[1]
    times = []
    for _ in range(3):
        begin = time.perf_counter()
        out = jax.block_until_ready(compiled(params, rest, opt_state, batch))
        times.append(time.perf_counter() - begin)
        params, opt_state = out[0], out[1]
    seconds = statistics.median(times)
    flops = _flops(compiled)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    analytic = 6.0 * n_params * rows * length
    report.add("grpo update", rows=rows, tokens=rows * length, compile_s=compile_s, seconds=seconds,
               xla_flops=flops, xla_flops_per_s=None if flops is None else flops / seconds,
               xla_lowered_flops=lowered_flops,
               six_n_tokens_flops=analytic, six_n_flops_per_s=analytic / seconds,
               memory=_memory(compiled), peak_memory_stats_bytes=_peak_bytes(device))


class TransformersGenerate:
    """transformers' Qwen2 on the same shape (random bf16 weights), built on first use; `run(compiled,
    rows)` measures one generate: eager (dynamic cache), or a static cache, whose forward transformers
    compiles itself on CUDA (on CPU it runs uncompiled: compiling needs a C++ toolchain and minutes)."""

    def __init__(self, report: Report, shapes: dict, config: Any) -> None:
        self.report, self.shapes, self.config = report, shapes, config
        self.model: Any = None

    def _build(self) -> None:
        import torch
        from transformers import Qwen2Config as HFConfig
        from transformers import Qwen2ForCausalLM as HFQwen2

        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda" if self.cuda else "cpu")
        fields = {k: v for k, v in self.config.to_hf().items() if k not in ("architectures", "torch_dtype")}
        hf = HFConfig(**fields | {"bos_token_id": None, "eos_token_id": None})  # no end: every token runs
        torch.manual_seed(0)
        with self.device:
            self.model = HFQwen2(hf).to(torch.bfloat16).eval()

    def run(self, compiled: bool, rows: int) -> None:
        import torch

        if self.model is None:
            self._build()
        mode = "static cache" if compiled else "eager"
        if compiled and not self.cuda:
            self.report.add("transformers generate", mode=mode, rows=rows, compiled="skipped off CUDA")
        shapes = self.shapes
        ids = torch.randint(3, self.config.vocab_size, (rows, shapes["prompt"]), device=self.device)
        kwargs = {"attention_mask": torch.ones_like(ids), "do_sample": True, "pad_token_id": 0,
                  "max_new_tokens": shapes["new"], "min_new_tokens": shapes["new"], "eos_token_id": None}
        if compiled:
            # transformers compiles the forward itself for a static cache (generation_config.compile_config,
            # on CUDA); wrapping it in torch.compile as well overwrote its CUDA graphs' outputs (H100 run).
            kwargs["cache_implementation"] = "static"

        def generate() -> None:
            with torch.inference_mode():
                self.model.generate(ids, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()

        start = time.perf_counter()
        generate()  # warm-up (and compile)
        warm_s = time.perf_counter() - start
        seconds = _median_s(generate, 2)
        self.report.add("transformers generate", mode=mode, compiled=compiled and self.cuda, rows=rows,
                        warmup_s=warm_s, seconds=seconds, ms_per_token=1e3 * seconds / shapes["new"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out",
                        help="folder for gpu_check.jsonl and gpu_check.txt (default: $OUT, else "
                        "./gpu_check_out)")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="start no section after this many seconds (default 450: done within 8 "
                        "minutes)")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny shapes: the whole script in seconds, on CPU too")
    args = parser.parse_args(argv)
    # JAX takes 75% of the GPU up front by default: transformers' section needs room, and the peak that
    # memory_stats() reports should be what the programs used.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    shapes = TINY if args.tiny else FULL
    report = Report(Path(args.out), args.budget_s)
    report.add("start", tiny=args.tiny, shapes=shapes, budget_s=args.budget_s)
    device = report.run("env", env_section, report)
    bandwidth = report.run("hbm", hbm_section, report, shapes)
    config = model_config(args.tiny)
    report.add("model", layers=config.num_hidden_layers, hidden=config.hidden_size, vocab=config.vocab_size,
               bf16_weight_bytes=weight_bytes(config, 2))
    rows = shapes["rows"]
    first = rows[len(rows) // 2]  # 32 on the full shapes
    model = report.run("trainer model", make_model, config)
    if model is not None:
        report.run("trainer generate", trainer_rollout_section, report, shapes, config, model, first,
                   bandwidth, device, True)
        report.run("grpo update", update_section, report, shapes, config, model, device)
        del model  # its weights were donated to the update
        gc.collect()
    hf = TransformersGenerate(report, shapes, config)
    for compiled in (False, True):
        report.run("transformers generate", hf.run, compiled, first)
    others = [r for r in rows if r != first]
    if others:
        model = report.run("trainer model", make_model, config)
        for r in others:
            if model is not None:
                report.run("trainer generate", trainer_rollout_section, report, shapes, config, model, r,
                           bandwidth, device, False)
        del model
        gc.collect()
    for compiled in (False, True):
        for r in others:
            report.run("transformers generate", hf.run, compiled, r)
    report.add("done", seconds=report.elapsed())
    return 0


if __name__ == "__main__":
    sys.exit(main())
