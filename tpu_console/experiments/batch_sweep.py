"""`tpu-console sweep NODE --config FILE --param rollout.batch_size`: the largest batch that fits.

By hand this is an OOM sweep: launch 2-step runs at growing batch sizes on every worker, read each one's
log for RESOURCE_EXHAUSTED, narrow down. Here each trial is a real run (launched on all workers like any
other, so it is in `tpu-console runs`), classified as *fits* (every worker finished), *oom*
(RESOURCE_EXHAUSTED on some worker) or *failed* (anything else: the sweep stops there, since a broken
config says nothing about memory). The search only tries values the pod can run at all: the trainer's own
shape check (prompts per process, local batch divisible by the local devices) filters the candidates.
It doubles from the config's value while trials fit, then bisects between the largest fit and the first
OOM. The result (every trial with its local batch and peak memory) is kept in
`$TPU_CONSOLE_HOME/sweeps/<id>.json`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.errors import UserError
from tpu_console.fleet.preflight import open_node
from tpu_console.launch.job_kinds import check_shape, validate_config
from tpu_console.launch.start import launch
from tpu_console.observe import lookup
from tpu_console.providers.base import Provider, no_progress

SWEEP_PARAMS = ("rollout.batch_size", "rollout.n")



@dataclass
class Trial:
    value: int
    local_batch: int
    run_id: str | None
    outcome: str  # fits, oom, failed
    peak_gib: float | None = None  # max over workers of the last step's peak device memory (null on CPU)
    detail: str | None = None


@dataclass
class SweepResult:
    sweep_id: str
    node: str
    config: str
    param: str
    trials: list[Trial] = field(default_factory=list)
    largest_fit: int | None = None
    first_oom: int | None = None
    stopped: str | None = None  # why the sweep ended early

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def candidate_values(
    config_path: str, overrides: Sequence[str], param: str, node: Any, limit: int
) -> list[int]:
    """Values of `param` in 1..limit that the trainer would accept on this node's shape."""
    values = []
    for value in range(1, limit + 1):
        try:
            check_shape(
                validate_config(config_path, [*overrides, f"{param}={value}"]), node, node.shape.workers
            )
        except UserError:
            continue
        values.append(value)
    return values


def next_value(candidates: list[int], trials: dict[int, str], start: int) -> int | None:
    """The next value to try: double up from the largest fit while nothing failed, then bisect between
    the largest fit and the smallest OOM; None when they are neighbours (or nothing is left)."""
    fits = [v for v, o in trials.items() if o == "fits"]
    ooms = [v for v, o in trials.items() if o == "oom"]
    if not trials:
        return start
    low = max(fits) if fits else None
    high = min(ooms) if ooms else None
    if high is None:  # everything tried fits: double
        above = [c for c in candidates if c >= 2 * low]
        return above[0] if above else next((c for c in candidates if c > low), None)
    between = [c for c in candidates if (low is None or c > low) and c < high]
    if not between:
        return None
    if low is None:  # nothing fits yet: walk down by halves from the smallest OOM
        below = [c for c in between if c <= high // 2]
        return below[-1] if below else between[0]
    return between[len(between) // 2]


async def sweep(
    providers: dict[str, Provider],
    node_name: str,
    config_path: str,
    param: str = "rollout.batch_size",
    overrides: Sequence[str] = (),
    *,
    steps: int = 2,
    limit: int | None = None,
    env_file: str | None = None,
    python: str | None = None,
    progress: Callable[[str], None] = no_progress,
) -> SweepResult:
    if param not in SWEEP_PARAMS:
        raise UserError(f"--param {param} cannot be swept; use one of {', '.join(SWEEP_PARAMS)}")
    base = validate_config(config_path, overrides)
    start = int(base.data["rollout"][param.split(".")[1]])
    _, node = await open_node(providers, node_name)
    limit = limit or max(16, start * 16)
    trial_overrides = [*overrides, f"steps={steps}", "eval_every_steps=0"]
    candidates = candidate_values(config_path, trial_overrides, param, node, limit)
    if not candidates:
        raise UserError(
            f"no value of {param} up to {limit} fits {node.name}'s shape "
            f"({node.shape.workers} workers x {node.shape.devices_per_worker} devices)"
        )
    start = start if start in candidates else candidates[0]
    result = SweepResult(datetime.now(UTC).strftime("%Y%m%d-%H%M%S"), node.name, str(base.path), param)
    outcomes: dict[int, str] = {}
    while (value := next_value(candidates, outcomes, start)) is not None and value not in outcomes:
        progress(f"{node.name}: trial {param}={value} ({steps} steps on every worker)")
        trial = await _trial(
            providers, node_name, config_path, trial_overrides, param, value, env_file, python
        )
        progress(
            f"{node.name}: {param}={value} (local batch {trial.local_batch}): {trial.outcome}"
            + (f" ({trial.detail})" if trial.detail and trial.outcome != "fits" else "")
        )
        result.trials.append(trial)
        outcomes[value] = trial.outcome
        if trial.outcome == "failed":
            result.stopped = f"{param}={value} failed for another reason than memory: {trial.detail}"
            break
    fits = [v for v, o in outcomes.items() if o == "fits"]
    ooms = [v for v, o in outcomes.items() if o == "oom"]
    result.largest_fit = max(fits) if fits else None
    result.first_oom = min(ooms) if ooms else None
    _save(result)
    return result


async def _trial(
    providers: dict[str, Provider],
    node_name: str,
    config_path: str,
    overrides: list[str],
    param: str,
    value: int,
    env_file: str | None,
    python: str | None,
) -> Trial:
    sets = [*overrides, f"{param}={value}"]
    config = validate_config(config_path, sets)
    rollout = config.data["rollout"]
    launched = await launch(providers, node_name, config_path, sets, env_file, python=python)
    local_batch = rollout["batch_size"] // len(launched.workers) * rollout["n"]
    if not launched.ok:
        first = next(s for s in launched.starts if not s.ok)
        return Trial(
            value, local_batch, launched.run_id, "failed", detail=f"worker {first.worker} did not start"
        )
    view = await lookup.logs(providers, launched.run_id, lambda _w, _t: None, lines=0, follow=True)
    peaks = [
        s.events.last_step.mem_peak_gib
        for s in view.workers
        if s.events.last_step is not None and s.events.last_step.mem_peak_gib is not None
    ]
    peak = max(peaks) if peaks else None
    if view.state == "succeeded":
        return Trial(value, local_batch, launched.run_id, "fits", peak)
    errors = [s.events.error for s in view.workers if s.events.error is not None]
    oom = any(
        e.get("resource_exhausted") or "RESOURCE_EXHAUSTED" in str(e.get("message", "")) for e in errors
    )
    return Trial(value, local_batch, launched.run_id, "oom" if oom else "failed", peak, view.failure)


def sweeps_dir() -> Path:
    path = locations.home() / "sweeps"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _save(result: SweepResult) -> None:
    (sweeps_dir() / f"{result.sweep_id}-{result.node}.json").write_text(
        json.dumps(result.to_json(), indent=2)
    )
