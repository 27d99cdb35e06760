"""Verbs that measure or plan: `bench-memory`, `sweep` (trial runs, or `--compile-only` from plans alone) and
`plan` (the TPU compiler's per-chip memory and cost for a config on a TPU type, no TPU needed)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.errors import UserError
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import find_node
from tpu_console.settings import Settings

# `tpu-console plan`'s exit statuses, as python -m trainer plan's.
PLAN_EXIT = {"fits": 0, "does-not-fit": 1, "error": 2, "unavailable": 3}


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
        "Every trial is a run in `tpu-console runs`; the sweep is kept in $TPU_CONSOLE_HOME/sweeps/. "
        "With --compile-only, no run and no pod: the same search over the TPU compiler's plans for the "
        "node's TPU type (or --type T).",
    )
    flags.add_node_or_type(sweep)
    flags.add_config(sweep, "override a config key for every trial (repeatable)")
    sweep.add_argument("--param", default="rollout.batch_size",
                       help="rollout.batch_size (default) or rollout.n")
    sweep.add_argument("--steps", type=int, default=2, help="steps per trial (default 2)")
    sweep.add_argument("--max", "--limit", dest="limit", type=int, metavar="N",
                       help="largest value to try (default 16x the config's; 256 with --compile-only)")
    sweep.add_argument("--compile-only", action="store_true",
                       help="plans instead of trial runs: the TPU compiler says what fits (no TPU needed)")
    _add_slices(sweep)
    flags.add_env_file(sweep, "secrets for the trials, as for launch")
    flags.add_python(sweep)

    plan = verbs.add_parser(
        "plan", parents=[common], help="will a config fit a TPU type? the TPU compiler's plan, no TPU needed",
        description="Compile every program the trainer runs for the config on the TPU type (a node's, or "
        "--type T; a local pod plans for the type it rehearses, local-v6e-8 as v6e-8) with libtpu on this "
        "machine, and print per chip: what is resident, each program's memory, flops, bytes accessed and "
        "collectives, an estimated step time, and a verdict. Answers are cached in $TPU_CONSOLE_HOME/plans "
        "by config digest, type, jax/libtpu versions and trainer source. Exit status: 0 fits, 1 does not "
        "fit, 2 bad input, 3 cannot plan here (no libtpu).",
    )
    flags.add_node_or_type(plan)
    flags.add_config(plan, "override a config key, e.g. --set rollout.n=8 (repeatable)")
    plan.add_argument("--no-cache", dest="use_cache", action="store_false",
                      help="plan again even if an answer is cached")
    _add_slices(plan)


def _add_slices(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slices", type=int, metavar="N",
                        help="with --type: plan for N slices of it joined over the data-center network "
                        "(Multislice; a node plans for its own slices)")


async def bench_memory(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.experiments import memory_bench
    from tpu_console.views.nodes import format_table

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

    if args.compile_only:
        return await _compile_only_sweep(args, providers)
    if args.accelerator_type or not args.node:
        raise UserError("sweep runs trials on a node: `tpu-console sweep NODE --config F`; "
                        "--type T goes with --compile-only")
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


async def _compile_only_sweep(args: argparse.Namespace, providers: dict[str, Provider]) -> int:
    from tpu_console.experiments.planning import compile_only_sweep
    from tpu_console.launch.job_kinds import validate_config

    config = validate_config(args.config, args.overrides)  # a bad config is one line, before any plan
    tpu_type, slices = await _tpu_type(args, providers)
    if args.limit is not None and args.limit < 1:
        raise UserError("--limit must be at least 1")
    result = await compile_only_sweep(
        config.path, config.overrides, tpu_type, args.param, limit=args.limit or 256,
        progress=output.progress, slices=slices,
    )
    if args.json:
        output.print_json(result.to_json())
        return 0 if result.stopped is None else 1
    print(output.compile_sweep_table(args.param, result.trials))
    if result.largest_fit is None:
        print(f"no value of {args.param} that was tried fits {tpu_type}")
    else:
        print(f"largest that fits {tpu_type}: {args.param}={result.largest_fit} "
              f"(local batch {result.largest_local_batch} sequences per host)")
    if result.stopped:
        print(f"stopped: {result.stopped}", file=sys.stderr)
    return 0 if result.stopped is None else 1


async def plan(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    from tpu_console.experiments.planning import plan as make_plan
    from tpu_console.launch.job_kinds import validate_config

    config = validate_config(args.config, args.overrides)  # a bad config is one line, before any plan
    tpu_type, slices = await _tpu_type(args, providers)
    outcome = await make_plan(
        config.path, config.overrides, tpu_type, config_digest=config.digest, progress=output.progress,
        use_cache=args.use_cache, slices=slices,
    )
    if args.json:
        output.print_json(outcome.to_json())
    elif outcome.plan is not None:
        print(output.plan_text(outcome.plan))
        if outcome.cached:
            print("(from the cache; --no-cache plans again)", file=sys.stderr)
    if outcome.status == "unavailable":
        print(f"error: cannot plan here: {outcome.verdict}", file=sys.stderr)
    elif outcome.status == "error":
        print(f"error: {outcome.verdict}", file=sys.stderr)
    return PLAN_EXIT[outcome.status]


async def _tpu_type(args: argparse.Namespace, providers: dict[str, Provider]) -> tuple[str, int]:
    """The TPU type to plan for and how many slices of it: --type T's and --slices N, or the node's (a local
    pod's rehearsed type)."""
    from tpu_console.experiments.planning import tpu_type_for

    if bool(args.node) == bool(args.accelerator_type):
        raise UserError("give a node or --type T (e.g. --type v6e-16), one of them")
    slices = getattr(args, "slices", None)
    if slices is not None and (args.node or slices < 1):
        raise UserError("--slices N goes with --type T, N at least 1 (a node plans for its own slices)")
    if args.accelerator_type:
        tpu_type = tpu_type_for(args.accelerator_type)
        if tpu_type is None:
            raise UserError(f"{args.accelerator_type} is not a TPU type; give one such as v6e-8, v6e-16 or "
                            "v4-16 (a local pod's local-v6e-8 plans as v6e-8)")
        return tpu_type, slices or 1
    _, node = await find_node(providers, args.node)
    tpu_type = tpu_type_for(node.accelerator_type)
    if tpu_type is None:
        raise UserError(f"{node.name} is a {node.accelerator_type} pod, a shape no TPU has; plan with "
                        "--type T (e.g. v6e-8), or on a pod that rehearses one (local-v6e-8)")
    return tpu_type, getattr(node, "slices", 1) or 1


HANDLERS = {"bench-memory": bench_memory, "sweep": sweep, "plan": plan}
