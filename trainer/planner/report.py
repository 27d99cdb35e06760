"""The plan as a report: what each program of a run holds and costs per chip, the verdict, the step's time.

trainer/planner/plan.py builds a `Plan` (it compiles the run's programs for a TPU slice); this module holds
what is read from it: per program its arguments, outputs, temporaries, aliases and the peak held at once; the
verdict (fits, or what to change); each program's estimated time and the step's, as ranges
(trainer/planner/estimate.py has the method); and the plan as text (`format_plan`) or JSON (`plan_to_json`).

Peak held at once = the program's own peak (arguments + outputs not aliased to an argument + temporaries +
code) + the state that stays resident through the step but is not one of its arguments (the fp32 weights
and optimizer state while the rollout runs, the reference weights during the update).

Estimated time: a range per chip and per program: HBM priced from the floor (what must be read once) at
the low end and at the high end from the bytes the compiled program moves across HBM
(trainer/planner/hbm_traffic.py; the compiler's `bytes accessed` is shown beside it) or the floor times what
a chip was measured to take over it, whichever is more; collectives priced by
kind over the slice's torus with the scaling book's latencies at either end (trainer/planner/estimate.py). The
step is rollout weights + prefill + the decode loop's expected steps (the longest row of each earlier step of
the same config when the console has them, `--longest-rows`; else the config's maximum) + the update (+
log-prob passes when they run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from trainer.planner import dcn
from trainer.planner.estimate import (
    ZERO,
    ProgramCost,
    Range,
    dcn_range,
    expected_steps,
    mean_cache_fraction,
    network_lines,
    network_step,
    price,
    step_lines,
)
from trainer.planner.tpu_compile import CompiledProgram
from trainer.planner.tpu_specs import TpuSlice

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



@dataclass
class ProgramPlan:
    name: str
    runs: str  # when the run executes it: "once", "every step", "per token", ...
    compiled: CompiledProgram
    held_outside: int  # resident bytes that are not the program's arguments
    estimate: Range | None = None  # seconds per chip, low..high, at the plan's expected decode length
    floor_bytes: float = 0.0  # what must cross HBM once (the estimate's low end)
    dcn_estimate: Range | None = None  # of that, the transfers between slices (Multislice)

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
            "hbm_traffic_bytes": c.hbm_traffic_bytes,
            "collective_bytes": c.collectives.bytes,
            "collectives": c.collectives.count,
            "collectives_by_kind": c.collectives.by_kind,
            "collective_ops": c.collectives.grouped(),
            "floor_bytes": self.floor_bytes,
            "compiler_seconds": c.compiler_seconds,
            "estimated_seconds": None if self.estimate is None else self.estimate.to_json(),
            "compile_seconds": round(c.compile_s, 2),
            "dcn_ops": dcn.grouped(c.dcn),
            "dcn_bytes": sum(op.wire_bytes for op in c.dcn),
            "dcn_seconds": None if self.dcn_estimate is None else self.dcn_estimate.to_json(),
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
    slices: int = 1  # Multislice: this many slices of `accelerator_type` (chips and hosts are one slice's)

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
        cost = ProgramCost(c.flops, c.bytes_accessed, self.floor_bytes(p, steps), c.collectives.grouped(),
                           dcn.grouped(c.dcn), c.hbm_traffic_bytes)
        return price(cost, self.tpu)

    def price_programs(self) -> None:
        """Each program's estimate and floor at the expected decode length (after the last compile, or
        after `longest_rows` changes)."""
        for p in self.programs:
            p.floor_bytes = self.floor_bytes(p)
            p.estimate = self.estimate(p)
            if self.tpu is not None and not p.compiled.oom:
                p.dcn_estimate = dcn_range(dcn.grouped(p.compiled.dcn), self.tpu)

    def network_step(self, steps: float | None = None) -> dict | None:
        """Bytes a chip sends in one training step inside its slice (ICI) and between slices (DCN), and
        their time, low..high (trainer/planner/estimate.py network_step)."""
        if self.tpu is None:
            return None
        programs = {p.name: (p.compiled.collectives.grouped(), dcn.grouped(p.compiled.dcn))
                    for p in self.programs if not p.compiled.oom}
        steps = self.expected_new_tokens if steps is None else steps
        return network_step(programs, self.tpu, steps, self.logprob_passes, self.slices)

    def step_estimate(self, steps: float | None = None) -> dict[str, Range]:
        """Seconds per phase of one training step, low..high, with the decode loop at `steps` tokens (the
        expected number by default)."""
        steps = self.expected_new_tokens if steps is None else steps
        by = {p.name: p for p in self.programs}

        def est(name: str) -> Range:  # nothing for a program not compiled (or out of memory)
            p = by.get(name)
            return (self.estimate(p, steps) or ZERO) if p is not None else ZERO

        # Each token also waits on the other slices in the loop's condition (Multislice;
        # trainer/planner/dcn.py).
        loop = by.get("decode loop")
        waits = ZERO if loop is None or self.tpu is None else dcn_range(
            dcn.per_token(dcn.grouped(loop.compiled.dcn)), self.tpu)
        phases = {"rollout_generate_s": est("rollout weights") + est("prefill")
                  + (est("decode step") + waits) * steps}
        phases["update_s"] = est("update") + est("log-probs") * self.logprob_passes
        phases["step_s"] = phases["rollout_generate_s"] + phases["update_s"]
        return phases

    def to_json(self) -> dict:
        name, size = self.largest_consumer()
        return {
            "accelerator_type": self.accelerator_type,
            "slices": self.slices,
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
            "network_step": self.network_step(),
            "config_digest": self.config_digest,
            "versions": self.versions,
            "programs": [p.to_json() for p in self.programs],
        }



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
    where = f"{plan.slices} x {plan.accelerator_type}" if plan.slices > 1 else plan.accelerator_type
    each = " each" if plan.slices > 1 else ""
    title = (
        f"plan for {where} ({plan.topology}{each}: {plan.hosts} hosts, {plan.chips} chips, "
        f"{_gib(plan.hbm_bytes)} GiB HBM a chip as the compiler allows); model {plan.model_source}; "
        f"mesh {plan.mesh}; rollout weights {plan.weight_layout}"
    )
    header = (
        f"{'program (bytes per chip)':<24}{'runs':<15}{'args':>7}{'out':>7}{'temp':>7}{'alias':>7}"
        f"{'peak':>7}{'GFLOP':>9}{'acc GB':>8}{'HBM GB':>8}{'floor GB':>9}{'coll MB':>9}{'#coll':>7}"
        f"{'est ms':>18}{'xla ms':>9}"
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
            f"{c.flops / 1e9:>9.1f}{c.bytes_accessed / 1e9:>8.2f}{c.hbm_traffic_bytes / 1e9:>8.2f}"
            f"{p.floor_bytes / 1e9:>9.2f}"
            f"{c.collectives.bytes / 1e6:>9.1f}{c.collectives.count:>7}"
            f"{'-' if p.estimate is None else p.estimate.text(1e3):>18}{xla:>9}"
        )
    as_json = plan.to_json()
    lines += ["", *step_lines(as_json), *network_lines(as_json), plan.verdict()]
    return "\n".join(lines)


def plan_to_json(plan: Plan) -> str:
    return json.dumps(plan.to_json(), indent=2)
