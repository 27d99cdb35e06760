"""Plans on the console's side: will this config fit this node's TPU type, by the TPU compiler's own analysis?

The trainer's planner (`python -m trainer plan`, trainer/planner/plan.py) compiles every program of a run for
a TPU slice with libtpu, on this machine and without a TPU. The console runs it as a subprocess (it imports
JAX, which the console itself never does), reads its JSON, and keeps each answer in
`$TPU_CONSOLE_HOME/plans/`, keyed by the config's digest, the slice, the jax and libtpu versions, the
trainer's source and the measured lengths below: a second launch of the same config on the same type
answers at once.

The decode loop is priced at its expected length: where earlier runs of the same config (the same digest)
are in the history with their events archived, the longest completion of each of their steps
(`train/completion_length/max`, gathered over every process, so the row that bounds that step's loop);
otherwise the config's maximum.

Uses: `tpu-console plan`, the check `launch` makes before anything is sent (refused when the compiler
says the config does not fit, unless --no-plan-check), the launch form's planned peak HBM, and
`sweep --compile-only` (the largest batch from plans alone).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.errors import UserError

# python -m trainer plan's exit statuses (trainer/planner/plan.py).
EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT, EXIT_CANNOT_PLAN = 0, 1, 2, 3
LOCAL_PREFIX = "local-"
CANNOT_PLAN = "cannot plan here: "  # how the planner's exit 3 begins its one line


def tpu_type_for(accelerator_type: str) -> str | None:
    """The TPU type a node runs as: its own (v6e-16), a local pod's rehearsed one (local-v6e-16 -> v6e-16),
    or None for shapes no TPU has (local-2x4)."""
    from trainer.planner.tpu_specs import UnknownAcceleratorType, parse_accelerator_type

    name = accelerator_type.removeprefix(LOCAL_PREFIX)
    try:
        return parse_accelerator_type(name).accelerator_type
    except UnknownAcceleratorType:
        return None


@dataclass(frozen=True)
class PlanOutcome:
    tpu_type: str
    status: str  # fits, does-not-fit, unavailable (no libtpu here), error (bad input)
    verdict: str  # one line: the planner's verdict, or why there is none
    plan: dict[str, Any] | None = None  # the planner's JSON
    cached: bool = False

    @property
    def fits(self) -> bool:
        return self.status == "fits"

    @property
    def peak_gib(self) -> float | None:
        peak = (self.plan or {}).get("peak_bytes")
        return None if peak is None else peak / 2**30

    @property
    def hbm_gib(self) -> float | None:
        hbm = (self.plan or {}).get("hbm_bytes")
        return None if hbm is None else hbm / 2**30

    def summary(self) -> str:
        """For a status line: `v6e-16: peak 15.6 of 31.2 GiB per chip (50% free)` or the verdict."""
        if self.fits and self.peak_gib is not None and self.hbm_gib is not None:
            free = 1 - self.peak_gib / self.hbm_gib
            return (f"{self.tpu_type}: planned peak {self.peak_gib:.1f} of {self.hbm_gib:.1f} GiB per chip "
                    f"({free:.0%} free)")
        if self.status == "unavailable":
            return f"{self.tpu_type}: {CANNOT_PLAN}{self.verdict}"
        return f"{self.tpu_type}: {self.verdict}"

    def to_json(self) -> dict[str, Any]:
        return {
            "tpu_type": self.tpu_type,
            "status": self.status,
            "verdict": self.verdict,
            "cached": self.cached,
            "plan": self.plan,
        }


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _trainer_source_digest() -> str:
    import trainer

    root = Path(trainer.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):  # the planner and the rollout layouts are in subpackages
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_key(config_digest: str, tpu_type: str) -> str:
    parts = [
        config_digest,
        tpu_type,
        _package_version("jax") or "",
        _package_version("libtpu") or "",
        _trainer_source_digest(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def measured_longest_rows(config_digest: str, limit: int = 20) -> list[int]:
    """The longest completion of each step of earlier runs of this config, from their archived events
    (worker 0's: the trainer gathers the lengths over every process before it logs them)."""
    from tpu_console.history.events import parse_events
    from tpu_console.history.store import RunStore
    from trainer import telemetry as tm

    rows: list[int] = []
    try:
        runs = [r for r in RunStore().list(limit=500) if r.config_digest == config_digest][:limit]
    except Exception:  # noqa: BLE001 - no history yet (or an unreadable one) prices at the maximum
        return rows
    for run in runs:
        if not run.archive_path:
            continue
        events = Path(run.archive_path) / "worker-0" / "events.jsonl"
        if not events.is_file():
            continue
        for event in parse_events(events.read_text(errors="replace")):
            value = event.get(tm.COMPLETION_LEN_MAX)
            if event.kind == tm.KIND_STEP and isinstance(value, int | float):
                rows.append(int(value))
    return rows


def plans_dir() -> Path:
    path = locations.home() / "plans"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def plan(
    config_path: str | Path,
    overrides: Sequence[str],
    tpu_type: str,
    *,
    config_digest: str,
    python: str | None = None,
    progress: Callable[[str], None] | None = None,
    use_cache: bool = True,
    memory_only: bool = False,
    slices: int = 1,
) -> PlanOutcome:
    """The planner's answer for this config on `tpu_type` (cached), on `slices` slices of it (Multislice).
    Never raises for the planner's own verdicts: a config that does not fit, or no libtpu here, are
    outcomes."""
    longest = [] if memory_only else measured_longest_rows(config_digest)
    lengths = ",".join(str(n) for n in longest)
    where = tpu_type + (f" x{slices}" if slices > 1 else "")
    key = cache_key(config_digest, where + (" memory-only" if memory_only else "") + " " + lengths)
    cached = plans_dir() / f"{key}.json"
    if use_cache and cached.is_file():
        data = json.loads(cached.read_text())
        return PlanOutcome(tpu_type, data["status"], data["verdict"], data.get("plan"), cached=True)
    if progress:
        progress(
            f"planning {Path(config_path).name} on {_slices_text(tpu_type, slices)} with the TPU compiler "
            "(libtpu, no TPU needed; a large model takes minutes the first time, then it is cached)"
        )
    args = [
        python or sys.executable,
        "-m",
        "trainer",
        "plan",
        "--config",
        str(config_path),
        "--topology",
        tpu_type,
        "--json",
        "--quiet",
        *(["--memory-only"] if memory_only else []),
        *(["--longest-rows", lengths] if lengths else []),
        *(["--slices", str(slices)] if slices > 1 else []),
    ]
    for item in overrides:
        args += ["--set", item]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    message = _last_line(err.decode(errors="replace"))
    data = _json_or_none(out) if proc.returncode in (EXIT_FITS, EXIT_DOES_NOT_FIT) else None
    if data is not None:  # not a crash that exits 1 too (a traceback, no JSON)
        status = "fits" if proc.returncode == EXIT_FITS else "does-not-fit"
        outcome = PlanOutcome(tpu_type, status, data["verdict"], data)
        cached.write_text(json.dumps({"status": status, "verdict": outcome.verdict, "plan": data}))
        return outcome
    if proc.returncode == EXIT_CANNOT_PLAN:  # the caller says "cannot plan here" once
        return PlanOutcome(tpu_type, "unavailable", message.removeprefix("error: ").removeprefix(CANNOT_PLAN))
    if proc.returncode is not None and proc.returncode < 0:  # killed: a large model's compile can take the
        # host's memory (Qwen2.5-7B's update needs about 24 GB of RAM to compile)
        return PlanOutcome(tpu_type, "error", f"the planner was killed by signal {-proc.returncode} (out of "
                           "host memory? a 7B model's compile needs about 24 GB of RAM)")
    if message.startswith("ModuleNotFoundError"):  # no JAX (or trainer dependency) in this environment
        return PlanOutcome(tpu_type, "unavailable", f"the planner cannot start here: {message}")
    return PlanOutcome(
        tpu_type, "error", message.removeprefix("error: ") or f"planner exited {proc.returncode}"
    )


def _slices_text(tpu_type: str, slices: int) -> str:
    return f"{slices} x {tpu_type}" if slices > 1 else tpu_type


def _json_or_none(out: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(out)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip() and not _is_libtpu_noise(line)]
    return lines[-1].strip() if lines else ""


def _is_libtpu_noise(line: str) -> bool:
    # libtpu logs a few lines of its own on start-up off a TPU VM (glog-style or WARNING: ...).
    return line[:1] in "WEI" and line[1:5].isdigit() or line.startswith("WARNING: ")


async def require_fit(
    config_path: str | Path,
    overrides: Sequence[str],
    accelerator_type: str,
    *,
    config_digest: str,
    node_name: str,
    progress: Callable[[str], None] | None = None,
    slices: int = 1,
) -> PlanOutcome | None:
    """Before a launch: refuse (UserError, nothing sent) a config the compiler says will not fit this
    node's TPU type. None when the type has no TPU to plan for; an outcome the caller reports otherwise
    (a plan that could not be made here does not block the launch)."""
    tpu_type = tpu_type_for(accelerator_type)
    if tpu_type is None:
        return None
    outcome = await plan(config_path, overrides, tpu_type, config_digest=config_digest, progress=progress,
                         slices=slices)
    if outcome.status == "does-not-fit":
        raise UserError(
            f"{Path(config_path).name} on {node_name} ({tpu_type}) {outcome.verdict}; nothing was "
            "launched (--no-plan-check launches anyway)"
        )
    return outcome


# ---- sweep --compile-only ----------------------------------------------------------------------------------


@dataclass
class CompileTrial:
    value: int
    local_batch: int
    fits: bool
    peak_gib: float | None
    verdict: str


@dataclass
class CompileSweep:
    tpu_type: str
    param: str
    trials: list[CompileTrial]
    largest_fit: int | None
    largest_local_batch: int | None
    stopped: str | None = None

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def slice_candidates(
    config_path: str | Path, overrides: Sequence[str], param: str, tpu_type: str, limit: int, slices: int = 1
) -> list[tuple[int, int]]:
    """(value, local batch) of `param` in 1..limit that the trainer accepts on the slices' shape."""
    from trainer.config import ConfigError, check_pod_shape, load_config, prompts_per_process
    from trainer.planner.tpu_specs import parse_accelerator_type

    tpu = parse_accelerator_type(tpu_type)
    hosts, local = tpu.hosts * slices, tpu.chips // tpu.hosts
    out = []
    for value in range(1, limit + 1):
        try:
            cfg = load_config(config_path, [*overrides, f"{param}={value}"])
            check_pod_shape(cfg, hosts, local, slices)
        except ConfigError:
            continue
        out.append((value, prompts_per_process(cfg, hosts) * cfg.rollout.n))
    return out


async def compile_only_sweep(
    config_path: str | Path,
    overrides: Sequence[str],
    tpu_type: str,
    param: str,
    *,
    limit: int = 256,
    progress: Callable[[str], None] | None = None,
    slices: int = 1,
) -> CompileSweep:
    """The largest value of `param` whose plan fits, from plans alone (no TPU, no pod): doubling from the
    config's value while plans fit, then bisecting between the largest fit and the first that does not."""
    from tpu_console.experiments.batch_sweep import next_value
    from trainer.config import load_config

    candidates = slice_candidates(config_path, overrides, param, tpu_type, limit, slices)
    if not candidates:
        raise UserError(
            f"no value of {param} in 1..{limit} suits {_slices_text(tpu_type, slices)}'s shape; check "
            "rollout.batch_size and rollout.n against its hosts and chips"
        )
    local_batch = dict(candidates)
    values = [v for v, _ in candidates]
    start = _get(load_config(config_path, list(overrides)).model_dump(), param)
    start = start if start in values else min(values, key=lambda v: abs(v - start))
    outcomes: dict[int, str] = {}
    trials: list[CompileTrial] = []
    result = CompileSweep(tpu_type, param, trials, None, None)
    while (value := next_value(values, outcomes, start)) is not None:
        sets = [*overrides, f"{param}={value}"]
        digest = load_config(config_path, sets).digest()
        if progress:
            progress(f"{param}={value} (local batch {local_batch[value]}): compiling for {tpu_type}")
        outcome = await plan(config_path, sets, tpu_type, config_digest=digest, memory_only=True,
                             slices=slices)
        if outcome.status not in ("fits", "does-not-fit"):
            result.stopped = f"{param}={value}: {outcome.verdict}"
            break
        outcomes[value] = "fits" if outcome.fits else "oom"
        trials.append(
            CompileTrial(value, local_batch[value], outcome.fits, outcome.peak_gib, outcome.verdict)
        )
        if progress:
            progress(f"{param}={value}: {outcome.verdict}")
    fitting = [t for t in trials if t.fits]
    if fitting:
        best = max(fitting, key=lambda t: t.value)
        result.largest_fit, result.largest_local_batch = best.value, best.local_batch
    return result


def _get(data: dict[str, Any], dotted: str) -> int:
    for part in dotted.split("."):
        data = data[part]
    return int(data)  # type: ignore[arg-type]


def launch_check(progress: Callable[[str], None]) -> Callable[[Any, Any], Awaitable[None]]:
    """`runs.launch`'s `before_send` for a launch with the plan check: once the config and the node's shape
    are checked and before any worker is reached, the TPU compiler's plan for the node's type (cached),
    refused when it does not fit. The planned peak is said as a progress line; a plan that cannot be made
    here (no libtpu, or the planner failed) is said in one line and does not block the launch."""

    async def check(config: Any, node: Any) -> None:
        outcome = await require_fit(config.path, config.overrides, node.accelerator_type,
                                    config_digest=config.digest, node_name=node.name, progress=progress,
                                    slices=getattr(node, "slices", 1))
        if outcome is None:
            return  # a shape no TPU has (local-2x4): nothing to plan for
        if outcome.fits:
            progress(outcome.summary())
        else:
            progress(f"{outcome.tpu_type}: no plan ({outcome.verdict}); launching without the check")

    return check
