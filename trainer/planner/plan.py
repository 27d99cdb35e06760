"""A plan before any TPU is rented: every program a run executes, compiled by the TPU compiler for a slice.

`python -m trainer plan --config F --topology v6e-16` builds the run's programs (trainer/programs.py, the same
objects the Trainer runs: the sampler's public programs, `rollout_weights_program`, `prefill`, `decode`,
`decode_step_program`, and the update's) over abstract weights (shapes from the model's config.json when it
can be read here, else the named preset; nothing is downloaded or allocated), compiles each for the slice
with libtpu (trainer/planner/tpu_compile.py; the update on a second thread beside the rollout's programs), and
hands the figures to the report (trainer/planner/report.py: per chip memory, the verdict, the estimated time,
the text and JSON).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, TrainerConfig, check_pod_shape, is_local_path
from trainer.model import Qwen2Config
from trainer.planner.report import Plan, ProgramPlan, format_plan, plan_to_json
from trainer.planner.tpu_compile import (
    CompiledProgram,
    compile_program,
    hbm_limit_bytes,
    libtpu_version,
    tpu_devices,
)
from trainer.planner.tpu_specs import TpuSlice

# The programs whose memory grows with the batch: enough for a sweep's fits / does-not-fit.
MEMORY_PROGRAMS = frozenset(
    {"prefill", "decode loop", "log-probs", "update", "prefill (eval)", "decode loop (eval)"}
)


class PlanError(ValueError):
    """Bad input to the planner (unknown model, topology); the message names the fix."""


# ---- the model's shapes ------------------------------------------------------------------------------------


def model_config_for(model_path: str) -> tuple[Qwen2Config, str]:
    """The model's Qwen2Config and where it came from: a local config.json, the Hugging Face cache (no
    download), or the preset its name matches."""
    local = Path(model_path).expanduser()
    if (local / "config.json").is_file():
        return Qwen2Config.from_hf(json.loads((local / "config.json").read_text())), str(
            local / "config.json"
        )
    if not is_local_path(model_path):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(model_path, "config.json")
        except Exception:  # noqa: BLE001 - a cache miss or an odd id both fall through to the presets
            cached = None
        if isinstance(cached, str):
            return Qwen2Config.from_hf(json.loads(Path(cached).read_text())), cached
    from trainer.model import PRESETS

    name = model_path.lower().rstrip("/").rsplit("/", 1)[-1].removesuffix("-instruct")
    if name in PRESETS:
        return PRESETS[name], f"preset {name}"
    raise PlanError(
        f"model_path: cannot read {model_path}/config.json here and it names no preset "
        f"({', '.join(PRESETS)}); point model_path at a model folder or a Qwen2.5 hub id"
    )


# ---- building the programs over abstract weights -----------------------------------------------------------


def _per_chip_bytes(tree: Any) -> int:
    import jax
    import numpy as np

    total = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def _abstract(shape: tuple, dtype: Any, sharding: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _with_shardings(shapes: Any, shardings: Any) -> Any:
    import jax

    return jax.tree.map(lambda s, sh: _abstract(s.shape, s.dtype, sh), shapes, shardings)


def build_plan(
    cfg: TrainerConfig,
    tpu: TpuSlice,
    *,
    layout: dict[str, str] | None = None,
    only: set[str] | None = None,
    topology_order: bool = False,
    progress: Any = None,
    longest_rows: list[int] | None = None,
    slices: int = 1,
) -> Plan:
    """Compile every program `cfg` runs on `tpu` and assemble the report. layout: rollout keys to override
    (weight_layout, weight_copies; the benchmark compares layouts); only: compile just these programs;
    longest_rows: each earlier step's longest completion (the decode loop's expected length); slices: on
    this many slices of `tpu` (Multislice: the trainer's mesh, data parallel across slices,
    trainer/mesh.py; what crosses slices is counted on the DCN, trainer/planner/dcn.py)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from trainer.mesh import axis_sizes, make_mesh, train_sharding
    from trainer.programs import abstract_model, build_programs
    from trainer.rollout.sampler import SamplingState

    if slices < 1:
        raise PlanError(f"--slices {slices}: give 1 or more slices")
    devices = tpu_devices(tpu, slices)
    hosts = len({d.process_index for d in devices})
    local = len(devices) // hosts
    try:
        check_pod_shape(cfg, hosts, local, slices)
    except ConfigError as exc:
        where = f"{slices} x {tpu.accelerator_type}" if slices > 1 else tpu.accelerator_type
        raise PlanError(f"{exc} (on {where}: {hosts} hosts x {local} chips)") from None
    if layout:
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update=layout)})
    model_config, source = model_config_for(cfg.model_path)
    hbm = hbm_limit_bytes(tpu)
    mesh = make_mesh(cfg.mesh_shape, devices=list(devices), topology_order=topology_order)
    say = progress or (lambda _msg: None)
    t, r = cfg.train, cfg.rollout

    # Built outside the mesh context (optax initialises a little eagerly), traced and compiled inside it.
    model = abstract_model(cfg, model_config, mesh)  # the Trainer's: scanned when train.scan_layers
    eos = model_config.eos_token_ids or (0,)
    programs = build_programs(cfg, model, mesh, pad_id=0, eos_ids=eos)
    sampler, step_fn = programs.sampler, programs.step_fn
    _, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = _with_shardings(jax.eval_shape(programs.optimizer.init, params), programs.opt_shardings)
    with jax.set_mesh(mesh):
        resident = {"parameters": _per_chip_bytes(params), "optimizer state": _per_chip_bytes(opt_state)}
        if t.beta > 0:
            resident["reference weights"] = resident["parameters"]
        fp32_state = (
            resident["parameters"] + resident["optimizer state"] + resident.get("reference weights", 0)
        )

        plan = Plan(
            tpu.accelerator_type,
            tpu.topology_name,
            tpu.chips,
            hosts // slices,
            hbm,
            source,
            axis_sizes(mesh),
            sampler.weight_layout + (f" ({copies} copies)" if (copies := sampler.layout.copies) > 1 else ""),
            resident,
            versions={"jax": jax.__version__, "libtpu": libtpu_version()},
            config_digest=cfg.digest(),
            new_tokens=r.max_length_sample,
            prompt_len=r.global_length,
            longest_rows=list(longest_rows or []),
            tpu=tpu,
            slices=slices,
        )
        plan.logprob_passes = int(t.beta > 0) + int(t.ppo_epochs > 1)

        training_entries: list[ProgramPlan] = []  # the update's and log-probs', compiled beside the rollout

        def add(
            name: str, runs: str, held_outside: int, fn: Any, *args: Any, **kwargs: Any
        ) -> CompiledProgram:
            # Prefill is compiled whenever the decode loop is wanted: its outputs' layout is the loop's input.
            wanted = (
                only is None
                or name in only
                or (
                    name.startswith("prefill")
                    and not only.isdisjoint({"decode loop", "decode step", "decode loop (eval)"})
                )
            )
            if not wanted:
                return CompiledProgram(name)
            say(f"compiling {name} for {tpu.topology_name} ...")
            compiled = compile_program(name, fn, *args, **kwargs)
            entry = ProgramPlan(name, runs, compiled, held_outside)
            if only is None or name in only:
                training = name in ("log-probs", "update")
                (training_entries if training else plan.programs).append(entry)
            return compiled

        if only is None or "optimizer init" in only:
            add("optimizer init", "once", 0, programs.init_optimizer, params)

        # The update over the step's sequences, its micro-batches scanned inside; log-prob passes before it.
        batch = r.batch_size * r.n
        layout = train_sharding(mesh)
        length = r.global_length + r.max_length_sample
        train_batch = {
            "input_ids": _abstract((batch, length), jnp.int32, layout),
            "attention_mask": _abstract((batch, length), jnp.int32, layout),
            "completion_mask": _abstract((batch, r.max_length_sample), jnp.float32, layout),
            "advantages": _abstract((batch,), jnp.float32, layout),
        }
        for key_name in (["ref_logprobs"] if t.beta > 0 else []) + (
            ["old_logprobs"] if t.ppo_epochs > 1 else []
        ):
            train_batch[key_name] = _abstract((batch, r.max_length_sample), jnp.float32, layout)

        def compile_training() -> None:
            with jax.set_mesh(mesh):  # a thread starts outside the caller's mesh context
                if plan.logprob_passes:
                    add(
                        "log-probs",
                        f"{plan.logprob_passes}x every step",
                        fp32_state - resident["parameters"],
                        step_fn.logprobs,
                        params,
                        rest,
                        train_batch,
                    )
                add(
                    "update",
                    f"{t.ppo_epochs}x every step",
                    fp32_state - resident["parameters"] - resident["optimizer state"],
                    step_fn.update,
                    params,
                    rest,
                    opt_state,
                    train_batch,
                )

        # The update compiles on a second thread while the rollout compiles here: the programs are
        # independent and XLA compiles without the GIL, so a plan takes both cores (the update alone is
        # most of a 3B plan's compile time).
        beside = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        training_done = beside.submit(compile_training)

        # Rollout: the weights decode reads, prefill, the loop, and one step of it alone (per-token figures).
        # Under the rollout's own mesh: `head_groups` decodes on a mesh of its own.
        with sampler.mesh_context():
            on_rollout_mesh = NamedSharding(sampler.mesh, PartitionSpec())  # key, scalars
            state = nnx.merge_state(params, rest)
            weights_program = sampler.rollout_weights_program(state)  # what generate() runs first
            if weights_program is None:  # decode reads the training weights as they are
                rollout_state = state
            else:
                rollout_state = _with_shardings(
                    jax.eval_shape(weights_program, state), sampler.rollout_weight_shardings(state)
                )
                add("rollout weights", "every step", fp32_state - resident["parameters"], weights_program,
                    state)
            rollout_weights = _per_chip_bytes(rollout_state) if rollout_state is not state else 0
            held = fp32_state if rollout_state is not state else fp32_state - resident["parameters"]

            statics = {"top_k": r.top_k, "use_top_p": r.top_p < 1.0, "greedy": False}
            for label, rows, mode in _rollouts(cfg, hosts, local, batch, statics):
                rows_sharding = sampler.sharding
                ids = _abstract((rows, r.global_length), jnp.int32, rows_sharding)
                lens = _abstract((rows,), jnp.int32, rows_sharding)
                key = _with_shardings(jax.eval_shape(lambda: jax.random.key(0)), on_rollout_mesh)
                scalar = _abstract((), jnp.float32, on_rollout_mesh)
                # The prompts prefill runs: each distinct one once, its cache given to its samples, as
                # generate() does on one host (Sampler.shared_prompts); every row across hosts.
                distinct = rows if label else _prefilled_prompts(r.batch_size, rows, hosts, sampler.mesh.size)
                if distinct < rows:
                    prompts = _abstract((distinct, r.global_length), jnp.int32, rows_sharding)
                    which = _abstract((rows,), jnp.int32, rows_sharding)  # each row's prompt among them
                    prefill_args: tuple = (prompts, prompts, key, scalar, scalar, which)
                else:
                    prefill_args = (ids, ids, key, scalar, scalar)
                prefill = add(
                    f"prefill{label}",
                    "every step" if not label else "every eval",
                    held,
                    sampler.prefill,
                    rollout_state,
                    *prefill_args,
                    **mode,
                )
                if prefill.oom or prefill.output_shardings is None:  # did not fit, or not wanted
                    continue
                out_shapes = jax.eval_shape(sampler.prefill, rollout_state, *prefill_args, **mode)
                cache, kv_mask, first, first_logprobs = _with_shardings(out_shapes, prefill.output_shardings)
                if not label:
                    plan.resident["KV cache"] = _per_chip_bytes(cache)
                add(
                    f"decode loop{label}",
                    "every step" if not label else "every eval",
                    held,
                    sampler.decode_loop,
                    rollout_state,
                    cache,
                    kv_mask,
                    first,
                    first_logprobs,
                    lens,
                    key,
                    scalar,
                    scalar,
                    **mode,
                )
                if not label:
                    tokens = _abstract((rows, r.max_length_sample), jnp.int32, first.sharding)
                    logprobs = _abstract((rows, r.max_length_sample), jnp.float32, first.sharding)
                    done = _abstract((rows,), jnp.bool_, first.sharding)
                    counter = _abstract((), jnp.int32, on_rollout_mesh)
                    carry = SamplingState(counter, cache, kv_mask, tokens, logprobs, done)
                    step_args = (rollout_state, carry, logprobs, lens, scalar, scalar)
                    # A stacked cache (a scanned model's) in the layout the loop's state holds it: given in
                    # the default layout, the step alone would copy it into the layer loop's and back.
                    stacked = isinstance(cache, tuple)
                    add(
                        "decode step",
                        "per token",
                        held,
                        sampler.decode_step_program(**mode, cache_layout_for=step_args if stacked else None),
                        *step_args,
                    )
            plan.resident["rollout weights"] = rollout_weights

        training_done.result()  # raises what the update's compile raised
        beside.shutdown()
        plan.programs.extend(training_entries)
    plan.price_programs()
    return plan


def _prefilled_prompts(prompts: int, rows: int, hosts: int, devices: int) -> int:
    """How many prompts the training rollout's prefill runs for `rows` rows of `prompts` distinct prompts
    (each repeated by its group's samples): on one host, the distinct ones padded to a multiple of the
    rollout mesh's devices (Sampler.shared_prompts), when that is fewer than the rows; across hosts every
    row (each process holds only its own rows, so generate() shares no prefill)."""
    if hosts > 1:
        return rows
    return min(-(-prompts // devices) * devices, rows)


def _rollouts(cfg: TrainerConfig, hosts: int, local: int, batch: int, statics: dict) -> list:
    """(label, rows, sampling mode) of each generate a run calls: training's, and eval's when eval is on."""
    out = [("", batch, statics)]
    if cfg.eval_every_steps:
        wanted = math.ceil(cfg.eval_samples / hosts)
        rows = math.ceil(wanted / local) * local * hosts
        out.append((" (eval)", rows, {"top_k": 0, "use_top_p": False, "greedy": True}))
    return out



# ---- `python -m trainer plan` ------------------------------------------------------------------------------

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT, EXIT_CANNOT_PLAN = 0, 1, 2, 3


def main(argv: list[str]) -> int:
    """python -m trainer plan --config F [--set k=v ...] --topology v6e-16 [--json]

    Exit status: 0 fits, 1 does not fit (the compiler's OOM included), 2 bad input, 3 cannot plan here
    (no libtpu on this machine)."""
    import argparse
    import sys

    from trainer.config import load_config
    from trainer.planner.tpu_compile import LibtpuUnavailable
    from trainer.planner.tpu_specs import UnknownAcceleratorType, parse_accelerator_type

    parser = argparse.ArgumentParser(
        prog="python -m trainer plan",
        description="Compile every program of a run for a TPU slice with the TPU "
        "compiler (no TPU needed) and report per-chip memory and cost.",
    )
    parser.add_argument("--config", required=True, help="trainer YAML config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--topology", required=True, metavar="TYPE", help="accelerator type, e.g. v6e-16, v4-16"
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument(
        "--longest-rows",
        default="",
        metavar="N,N,...",
        help="the longest completion of each earlier step of this config (the console passes its "
        "history's): the decode loop is priced at their mean instead of the maximum",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="compile only the programs whose memory grows with the batch (prefill, the decode "
        "loop, log-probs, the update): what a batch sweep needs, in less time",
    )
    parser.add_argument(
        "--slices",
        type=int,
        default=1,
        metavar="N",
        help="N slices of the type joined over the data-center network (Multislice): the mesh the "
        "trainer builds there, and the bytes each step sends between slices",
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        tpu = parse_accelerator_type(args.topology)
        say = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
        only = MEMORY_PROGRAMS if args.memory_only else None
        try:
            longest = [int(x) for x in args.longest_rows.split(",") if x.strip()]
        except ValueError:
            bad = f"--longest-rows {args.longest_rows!r}: give whole numbers, e.g. 312,405"
            raise PlanError(bad) from None
        plan = build_plan(cfg, tpu, progress=say, only=only, longest_rows=longest, slices=args.slices)
    except (ConfigError, PlanError, UnknownAcceleratorType) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LibtpuUnavailable as exc:
        print(f"error: cannot plan here: {exc}", file=sys.stderr)
        return EXIT_CANNOT_PLAN
    print(plan_to_json(plan) if args.json else format_plan(plan))
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT
