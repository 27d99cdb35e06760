"""A plan before any TPU is rented: every program a run executes, compiled by the TPU compiler for a slice.

`python -m trainer plan --config F --topology v6e-16` builds the run's programs (trainer/programs.py, the same
objects the Trainer runs) over abstract weights (shapes from the model's config.json when it can be read
here, else the named preset; nothing is downloaded or allocated), compiles each for the slice with libtpu
(trainer/aot.py), and reports per chip: parameters, optimizer state, KV cache; for each program its
arguments, outputs, temporaries, aliases and the peak held at once, against the HBM the compiler allows;
a verdict; the compiler's flops, bytes accessed and collectives; and an estimated time.

Peak held at once = the program's own peak (arguments + outputs not aliased to an argument + temporaries +
code) + the state that stays resident through the step but is not one of its arguments (the fp32 weights
and optimizer state while the rollout runs, the reference weights during the update).

Estimated time: a range per chip and per program (trainer/estimate.py has the method and the source of
every constant): HBM priced from the floor (what must be read once) at the low end and from the compiler's
`bytes accessed` at the high end, collectives priced by kind over the slice's torus with assumed latencies
at either end. The step is rollout weights + prefill + the decode loop's expected steps (the longest row
of each earlier step of the same config when the console has them, `--longest-rows`; else the config's
maximum) + the update (+ log-prob passes when they run).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.aot import CompiledProgram, compile_program, hbm_limit_bytes, libtpu_version, tpu_devices
from trainer.config import ConfigError, TrainerConfig, check_pod_shape, is_local_path
from trainer.estimate import (
    ZERO,
    ProgramCost,
    Range,
    expected_steps,
    mean_cache_fraction,
    price,
    step_lines,
)
from trainer.model import Qwen2Config
from trainer.tpu_specs import TpuSlice

# The programs whose memory grows with the batch: enough for a sweep's fits / does-not-fit.
MEMORY_PROGRAMS = frozenset(
    {"prefill", "decode loop", "log-probs", "update", "prefill (eval)", "decode loop (eval)"}
)

# Which config key shrinks each kind of memory, for the verdict's fix.
FIXES = {
    "optimizer state": "a wider fsdp axis (mesh_shape: auto) or a larger slice",
    "parameters": "a wider fsdp axis (mesh_shape: auto) or a larger slice",
    "reference weights": "train.beta: 0 (no frozen reference), or a larger slice",
    "rollout weights": "rollout.weight_layout: fsdp (no full bf16 copy per chip)",
    "KV cache": "fewer sequences a step (rollout.batch_size or rollout.n) or a shorter "
    "rollout.max_length_sample / rollout.global_length",
    "update temporaries": "a smaller train.micro_batch_size_per_device, train.remat: true, or a smaller "
    "train.logprob_chunk",
    "log-prob temporaries": "a smaller train.micro_batch_size_per_device or train.logprob_chunk",
    "rollout temporaries": "fewer sequences a step (rollout.batch_size or rollout.n)",
}


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


# ---- the report --------------------------------------------------------------------------------------------


@dataclass
class ProgramPlan:
    name: str
    runs: str  # when the run executes it: "once", "every step", "per token", ...
    compiled: CompiledProgram
    held_outside: int  # resident bytes that are not the program's arguments
    estimate: Range | None = None  # seconds per chip, low..high, at the plan's expected decode length
    floor_bytes: float = 0.0  # what must cross HBM once (the estimate's low end)

    @property
    def peak_bytes(self) -> int:
        return self.compiled.peak_bytes + self.held_outside

    def to_json(self) -> dict:
        c = self.compiled
        return {
            "name": self.name,
            "runs": self.runs,
            "oom": c.oom,
            "argument_bytes": c.argument_bytes,
            "output_bytes": c.output_bytes,
            "temp_bytes": c.temp_bytes,
            "alias_bytes": c.alias_bytes,
            "code_bytes": c.code_bytes,
            "held_outside_bytes": self.held_outside,
            "peak_bytes": None if c.oom else self.peak_bytes,
            "flops": c.flops,
            "bytes_accessed": c.bytes_accessed,
            "collective_bytes": c.collectives.bytes,
            "collectives": c.collectives.count,
            "collectives_by_kind": c.collectives.by_kind,
            "collective_ops": c.collectives.grouped(),
            "floor_bytes": self.floor_bytes,
            "compiler_seconds": c.compiler_seconds,
            "estimated_seconds": None if self.estimate is None else self.estimate.to_json(),
            "compile_seconds": round(c.compile_s, 2),
        }


@dataclass
class Plan:
    accelerator_type: str
    topology: str
    chips: int
    hosts: int
    hbm_bytes: int
    model_source: str
    mesh: dict[str, int]
    weight_layout: str
    resident: dict[str, int]  # per chip: parameters, optimizer state, reference weights, KV cache ...
    programs: list[ProgramPlan] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    config_digest: str = ""
    new_tokens: int = 0  # the config's maximum new tokens
    prompt_len: int = 0  # the prompt bucket: the KV cache holds prompt_len + new_tokens slots
    longest_rows: list[int] = field(default_factory=list)  # each earlier step's longest row, where known
    logprob_passes: int = 0  # log-prob passes a step: reference (beta > 0), old policy (ppo_epochs > 1)
    tpu: TpuSlice | None = None

    # -- verdict ---------------------------------------------------------------------------------------

    @property
    def peak(self) -> ProgramPlan | None:
        fitting = [p for p in self.programs if not p.compiled.oom]
        return max(fitting, key=lambda p: p.peak_bytes) if fitting else None

    @property
    def fits(self) -> bool:
        return all(not p.compiled.oom and p.peak_bytes <= self.hbm_bytes for p in self.programs)

    @property
    def headroom(self) -> float | None:
        peak = self.peak
        return None if peak is None else 1 - peak.peak_bytes / self.hbm_bytes

    def largest_consumer(self) -> tuple[str, int]:
        """What takes the most memory at the worst moment, named as FIXES names it."""
        failing = next((p for p in self.programs if p.compiled.oom), None) or self.peak
        consumers = dict(self.resident)
        consumers.pop("KV cache", None)
        if failing is not None:
            kind = {"update": "update", "log-probs": "log-prob"}.get(failing.name.split(" ")[0], "rollout")
            consumers[f"{kind} temporaries"] = failing.compiled.temp_bytes
            if failing.name.startswith(("decode", "prefill")):
                consumers["KV cache"] = self.resident.get("KV cache", 0)
        name = max(consumers, key=lambda k: consumers[k])
        return name, consumers[name]

    def verdict(self) -> str:
        gib = self.hbm_bytes / 2**30
        if self.fits:
            peak = self.peak
            assert peak is not None
            return (
                f"fits: peak {peak.peak_bytes / 2**30:.2f} GiB of {gib:.2f} GiB per chip in {peak.name} "
                f"({self.headroom:.0%} free)"
            )
        oom = next((p for p in self.programs if p.compiled.oom), None)
        name, size = self.largest_consumer()
        fix = FIXES.get(name, "a smaller batch")
        where = (
            f"{oom.name}: the compiler says {oom.compiled.oom}"
            if oom
            else f"{self.peak.name} needs {self.peak.peak_bytes / 2**30:.2f} GiB of {gib:.2f} GiB per chip"
        )
        return f"does not fit: {where}; largest: {name} {size / 2**30:.2f} GiB; fix: {fix}"

    # -- time ------------------------------------------------------------------------------------------

    @property
    def expected_new_tokens(self) -> float:
        """The decode loop's expected steps: earlier steps' longest rows where known, else the maximum."""
        return expected_steps(self.longest_rows, self.new_tokens)

    def floor_bytes(self, p: ProgramPlan, steps: float | None = None) -> float:
        """What `p` must read from HBM at least once: a decode step its chip's weights and the KV cache up
        to the loop's mean length over `steps` tokens; any other program its arguments."""
        if p.name != "decode step":
            return float(p.compiled.argument_bytes)
        weights = self.resident.get("rollout weights") or self.resident.get("parameters", 0)
        fraction = mean_cache_fraction(
            self.prompt_len, self.new_tokens, self.expected_new_tokens if steps is None else steps
        )
        return weights + self.resident.get("KV cache", 0) * fraction

    def estimate(self, p: ProgramPlan, steps: float | None = None) -> Range | None:
        c = p.compiled
        if c.oom or self.tpu is None:
            return None
        cost = ProgramCost(c.flops, c.bytes_accessed, self.floor_bytes(p, steps), c.collectives.grouped())
        return price(cost, self.tpu)

    def price_programs(self) -> None:
        """Each program's estimate and floor at the expected decode length (after the last compile, or
        after `longest_rows` changes)."""
        for p in self.programs:
            p.floor_bytes = self.floor_bytes(p)
            p.estimate = self.estimate(p)

    def step_estimate(self, steps: float | None = None) -> dict[str, Range]:
        """Seconds per phase of one training step, low..high, with the decode loop at `steps` tokens (the
        expected number by default)."""
        steps = self.expected_new_tokens if steps is None else steps
        by = {p.name: p for p in self.programs}

        def est(name: str) -> Range:  # nothing for a program not compiled (or out of memory)
            p = by.get(name)
            return (self.estimate(p, steps) or ZERO) if p is not None else ZERO

        phases = {"rollout_generate_s": est("rollout weights") + est("prefill") + est("decode step") * steps}
        phases["update_s"] = est("update") + est("log-probs") * self.logprob_passes
        phases["step_s"] = phases["rollout_generate_s"] + phases["update_s"]
        return phases

    def to_json(self) -> dict:
        name, size = self.largest_consumer()
        return {
            "accelerator_type": self.accelerator_type,
            "topology": self.topology,
            "chips": self.chips,
            "hosts": self.hosts,
            "hbm_bytes": self.hbm_bytes,
            "model_source": self.model_source,
            "mesh": self.mesh,
            "weight_layout": self.weight_layout,
            "resident_bytes": self.resident,
            "fits": self.fits,
            "verdict": self.verdict(),
            "headroom": self.headroom,
            "peak_bytes": self.peak.peak_bytes if self.peak else None,
            "peak_program": self.peak.name if self.peak else None,
            "largest_consumer": {"name": name, "bytes": size},
            "step_estimate_s": {k: v.to_json() for k, v in self.step_estimate().items()},
            "step_estimate_at_max_s": {
                k: v.to_json() for k, v in self.step_estimate(float(self.new_tokens)).items()
            },
            "new_tokens": self.new_tokens,
            "expected_new_tokens": self.expected_new_tokens,
            "longest_rows_known": len(self.longest_rows),
            "config_digest": self.config_digest,
            "versions": self.versions,
            "programs": [p.to_json() for p in self.programs],
        }


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


def _abstract_model(model_config: Qwen2Config, cfg: TrainerConfig, mesh: Any) -> Any:
    """The model with ShapeDtypeStructs for weights, each carrying the sharding the loader would give it."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding

    from trainer.model import Qwen2ForCausalLM, fit_spec
    from trainer.train import DTYPES

    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(
            lambda: Qwen2ForCausalLM(
                model_config,
                nnx.Rngs(0),
                param_dtype=jnp.float32,
                compute_dtype=DTYPES[cfg.train.compute_dtype],
                remat=cfg.train.remat,
            )
        )
    for _, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param):
            axes = var.get_metadata().get("out_sharding") or ()
            var.set_value(
                jax.ShapeDtypeStruct(
                    var.shape, var.dtype, sharding=NamedSharding(mesh, fit_spec(var.shape, axes, mesh))
                )
            )
    return model


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
) -> Plan:
    """Compile every program `cfg` runs on `tpu` and assemble the report. layout: rollout keys to override
    (weight_layout, activation_layout, partial_sums; the benchmark compares layouts); only: compile just
    these programs; longest_rows: each earlier step's longest completion (the decode loop's expected
    length)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec

    from trainer.mesh import axis_sizes, make_mesh, train_sharding
    from trainer.programs import build_programs

    devices = tpu_devices(tpu)
    hosts = len({d.process_index for d in devices})
    local = len(devices) // hosts
    try:
        check_pod_shape(cfg, hosts, local)
    except ConfigError as exc:
        raise PlanError(f"{exc} (on {tpu.accelerator_type}: {hosts} hosts x {local} chips)") from None
    if layout:
        cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update=layout)})
    model_config, source = model_config_for(cfg.model_path)
    hbm = hbm_limit_bytes(tpu)
    mesh = make_mesh(cfg.mesh_shape, devices=list(devices), topology_order=topology_order)
    say = progress or (lambda _msg: None)
    t, r = cfg.train, cfg.rollout

    # Built outside the mesh context (optax initialises a little eagerly), traced and compiled inside it.
    model = _abstract_model(model_config, cfg, mesh)
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
            hosts,
            hbm,
            source,
            axis_sizes(mesh),
            sampler.weight_layout,
            resident,
            versions={"jax": jax.__version__, "libtpu": libtpu_version()},
            config_digest=cfg.digest(),
            new_tokens=r.max_length_sample,
            prompt_len=r.global_length,
            longest_rows=list(longest_rows or []),
            tpu=tpu,
        )
        plan.logprob_passes = int(t.beta > 0) + int(t.ppo_epochs > 1)

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
                plan.programs.append(entry)
            return compiled

        if only is None or "optimizer init" in only:
            add("optimizer init", "once", 0, programs.init_optimizer, params)

        # Rollout: the weights decode reads, prefill, the loop, and one step of it alone (per-token figures).
        # Under the rollout's own mesh: the `tensor` layout decodes on a mesh of its own.
        with sampler.mesh_context():
            on_rollout_mesh = NamedSharding(sampler.mesh, PartitionSpec())  # key, scalars
            state = nnx.merge_state(params, rest)
            rollout_state = jax.eval_shape(sampler.prepare_weights, state)
            if sampler.weight_layout == "replicated":
                whole = jax.tree.map(lambda _: on_rollout_mesh, rollout_state)
                rollout_state = _with_shardings(rollout_state, whole)
                add(
                    "rollout weights",
                    "every step",
                    fp32_state - resident["parameters"],
                    sampler._replicate,
                    state,
                )
            elif sampler.weight_layout in ("tensor", "megatron", "head_groups"):
                rollout_state = _with_shardings(rollout_state, sampler.layout_shardings(state))
                add(
                    "rollout weights",
                    "every step",
                    fp32_state - resident["parameters"],
                    sampler.layout_program(state),
                    state,
                )
            elif rollout_state is not state and any(
                x.dtype != p.dtype
                for x, p in zip(jax.tree.leaves(rollout_state), jax.tree.leaves(state), strict=True)
            ):
                rollout_state = _with_shardings(rollout_state, jax.tree.map(lambda x: x.sharding, state))
                add("rollout weights", "every step", fp32_state - resident["parameters"], sampler._cast,
                    state)
            else:
                rollout_state = state
            rollout_weights = _per_chip_bytes(rollout_state) if rollout_state is not state else 0
            held = fp32_state if rollout_state is not state else fp32_state - resident["parameters"]

            batch = r.batch_size * r.n
            statics = {"top_k": r.top_k, "use_top_p": r.top_p < 1.0, "greedy": False}
            for label, rows, mode in _rollouts(cfg, hosts, local, batch, statics):
                rows_sharding = sampler.sharding
                ids = _abstract((rows, r.global_length), jnp.int32, rows_sharding)
                lens = _abstract((rows,), jnp.int32, rows_sharding)
                key = _with_shardings(jax.eval_shape(lambda: jax.random.key(0)), on_rollout_mesh)
                scalar = _abstract((), jnp.float32, on_rollout_mesh)
                prefill = add(
                    f"prefill{label}",
                    "every step" if not label else "every eval",
                    held,
                    sampler._prefill,
                    rollout_state,
                    ids,
                    ids,
                    key,
                    scalar,
                    scalar,
                    **mode,
                )
                if prefill.oom or prefill.output_shardings is None:  # did not fit, or not wanted
                    continue
                out_shapes = jax.eval_shape(
                    sampler._prefill, rollout_state, ids, ids, key, scalar, scalar, **mode
                )
                cache, kv_mask, first, first_logprobs = _with_shardings(out_shapes, prefill.output_shardings)
                if not label:
                    plan.resident["KV cache"] = _per_chip_bytes(cache)
                add(
                    f"decode loop{label}",
                    "every step" if not label else "every eval",
                    held,
                    sampler._decode,
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
                    carry = (counter, cache, kv_mask, tokens, logprobs, done)
                    add(
                        "decode step",
                        "per token",
                        held,
                        sampler.decode_step_program(**mode),
                        rollout_state,
                        carry,
                        logprobs,
                        lens,
                        scalar,
                        scalar,
                    )
            plan.resident["rollout weights"] = rollout_weights

        # The update over the step's sequences, its micro-batches scanned inside; log-prob passes before it.
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
    plan.price_programs()
    return plan


def _rollouts(cfg: TrainerConfig, hosts: int, local: int, batch: int, statics: dict) -> list:
    """(label, rows, sampling mode) of each generate a run calls: training's, and eval's when eval is on."""
    out = [("", batch, statics)]
    if cfg.eval_every_steps:
        wanted = math.ceil(cfg.eval_samples / hosts)
        rows = math.ceil(wanted / local) * local * hosts
        out.append((" (eval)", rows, {"top_k": 0, "use_top_p": False, "greedy": True}))
    return out


# ---- text --------------------------------------------------------------------------------------------------


def _gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f}"


def _size(n: float) -> str:
    """Bytes in 5 characters or so: 1.23G, 45.6M, 12K (binary units)."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            value = n / scale
            return (
                f"{value:.2f}{unit}"
                if value < 10
                else f"{value:.1f}{unit}"
                if value < 100
                else f"{value:.0f}{unit}"
            )
    return f"{int(n)}"


def format_plan(plan: Plan) -> str:
    title = (
        f"plan for {plan.accelerator_type} ({plan.topology}: {plan.hosts} hosts, {plan.chips} chips, "
        f"{_gib(plan.hbm_bytes)} GiB HBM a chip as the compiler allows); model {plan.model_source}; "
        f"mesh {plan.mesh}; rollout weights {plan.weight_layout}"
    )
    header = (
        f"{'program (bytes per chip)':<24}{'runs':<15}{'args':>7}{'out':>7}{'temp':>7}{'alias':>7}"
        f"{'peak':>7}{'GFLOP':>9}{'HBM GB':>8}{'floor GB':>9}{'coll MB':>9}{'#coll':>6}{'est ms':>16}"
        f"{'xla ms':>9}"
    )
    lines = [
        title,
        "resident per chip: " + ", ".join(f"{k} {_size(v)}" for k, v in plan.resident.items()),
        "",
        header,
    ]
    for p in plan.programs:
        c = p.compiled
        if c.oom:
            lines.append(f"{p.name:<24}{p.runs:<15}OUT OF MEMORY: {c.oom}")
            continue
        xla = (
            "-" if c.compiler_seconds is None or c.compiler_seconds < 0 else f"{c.compiler_seconds * 1e3:.2f}"
        )
        lines.append(
            f"{p.name:<24}{p.runs:<15}{_size(c.argument_bytes):>7}{_size(c.output_bytes):>7}"
            f"{_size(c.temp_bytes):>7}{_size(c.alias_bytes):>7}{_size(p.peak_bytes):>7}"
            f"{c.flops / 1e9:>9.1f}{c.bytes_accessed / 1e9:>8.2f}{p.floor_bytes / 1e9:>9.2f}"
            f"{c.collectives.bytes / 1e6:>9.1f}{c.collectives.count:>6}"
            f"{'-' if p.estimate is None else p.estimate.text(1e3):>16}{xla:>9}"
        )
    lines += ["", *step_lines(plan.to_json()), plan.verdict()]
    return "\n".join(lines)


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2)


# ---- `python -m trainer plan` ------------------------------------------------------------------------------

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT, EXIT_CANNOT_PLAN = 0, 1, 2, 3


def main(argv: list[str]) -> int:
    """python -m trainer plan --config F [--set k=v ...] --topology v6e-16 [--json]

    Exit status: 0 fits, 1 does not fit (the compiler's OOM included), 2 bad input, 3 cannot plan here
    (no libtpu on this machine)."""
    import argparse
    import sys

    from trainer.aot import LibtpuUnavailable
    from trainer.config import load_config
    from trainer.tpu_specs import UnknownAcceleratorType, parse_accelerator_type

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
        plan = build_plan(cfg, tpu, progress=say, only=only, longest_rows=longest)
    except (ConfigError, PlanError, UnknownAcceleratorType) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LibtpuUnavailable as exc:
        print(f"error: cannot plan here: {exc}", file=sys.stderr)
        return EXIT_CANNOT_PLAN
    print(plan_to_json(plan) if args.json else format_plan(plan))
    return EXIT_FITS if plan.fits else EXIT_DOES_NOT_FIT
