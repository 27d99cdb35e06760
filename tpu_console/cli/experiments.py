"""Verbs that measure: `bench-memory` and `sweep`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.errors import UserError
from tpu_console.providers.base import Provider
from tpu_console.settings import Settings


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    bench = verbs.add_parser(
        "bench-memory", parents=[common], help="FSDP memory bench on every worker: sharded vs gathered bytes",
        description="For each mesh shape and mode, run `python -m trainer bench-memory` on every worker "
        "(joined by jax.distributed, one case after the other) and print per-device bytes against what FSDP "
        "predicts (total/fsdp sharded, total gathered), with device bytes in use and peak where the "
        "platform reports them.",
    )
    bench.add_argument("node")
    bench.add_argument("--mesh-shape", action="append", metavar="M",
                       help="a mesh shape to try: auto, host_local or dp,fsdp,tp (repeatable; default auto "
                       "and host_local)")
    bench.add_argument("--mode", default="sharded,gather", metavar="MODES", help="sharded, gather or both")
    bench.add_argument("--target-bytes-gib", type=float, default=5.6, metavar="X",
                       help="buffer size in GiB (default 5.6, Qwen2.5-3B in bf16)")
    bench.add_argument("--cols", type=int, default=4096, help="buffer columns (default 4096)")
    flags.add_python(bench)

    sweep = verbs.add_parser(
        "sweep", parents=[common], help="find the largest batch that fits in device memory",
        description="Short trial runs (--steps, 2 by default) on every worker at different values of "
        "--param: doubling from the config's value while they fit, then bisecting between the largest fit "
        "and the first RESOURCE_EXHAUSTED. Only values the trainer accepts on this node's shape are tried. "
        "Every trial is a run in `tpu-console runs`; the sweep is kept in $TPU_CONSOLE_HOME/sweeps/.",
    )
    sweep.add_argument("node")
    flags.add_config(sweep, "override a config key for every trial (repeatable)")
    sweep.add_argument("--param", default="rollout.batch_size",
                       help="rollout.batch_size (default) or rollout.n")
    sweep.add_argument("--steps", type=int, default=2, help="steps per trial (default 2)")
    sweep.add_argument("--max", dest="limit", type=int, metavar="N",
                       help="largest value to try (default 16x the config's)")
    flags.add_env_file(sweep, "secrets for the trials, as for launch")
    flags.add_python(sweep)


async def bench_memory(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.experiments import memory_bench
    from tpu_console.node_table import format_table

    shapes = [m.strip() for m in args.mesh_shape or ("auto", "host_local")]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    results = await memory_bench.bench_memory(
        providers, args.node, shapes, modes, args.target_bytes_gib, args.cols, python=args.python,
        progress=output.progress,
    )
    if args.json:
        output.print_json({"node": args.node, "cases": [
            {"mesh_shape": r.mesh_shape, "mode": r.mode, "ok": r.ok, "error": r.error, "bench": r.bench,
             "matches_prediction": r.matches_prediction} for r in results]})
    else:
        print(format_table(memory_bench.COLUMNS, memory_bench.table_rows(results)))
    return 0 if all(r.ok for r in results) else 1


async def sweep(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.experiments import batch_sweep

    if args.steps < 1:
        raise UserError("--steps must be at least 1")
    result = await batch_sweep.sweep(
        providers, args.node, args.config, args.param, args.overrides, steps=args.steps, limit=args.limit,
        env_file=args.env_file, python=args.python, progress=output.progress,
    )
    if args.json:
        output.print_json(result.to_json())
        return 0 if result.stopped is None else 1
    print(output.sweep_table(args.param, result.trials))
    largest = result.largest_fit if result.largest_fit is not None else "none"
    first_oom = result.first_oom if result.first_oom is not None else "none found"
    print(f"largest that fits: {args.param}={largest}; first that does not: {first_oom}")
    if result.stopped:
        print(f"stopped: {result.stopped}", file=sys.stderr)
    return 0 if result.stopped is None else 1


HANDLERS = {"bench-memory": bench_memory, "sweep": sweep}
