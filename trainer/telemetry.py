"""What a run tells the world: `events.jsonl` (read by the console), the human step line, and W&B.

Every process writes its own `events.jsonl` in the run folder: one flat JSON object per line,
`{"t": unix_s, "kind": ..., "process": i, ...}`. Step metrics use the W&B metric names below, so the console,
the log line and W&B all say the same thing. A metric the platform cannot give (device memory on CPU) is
`null`, never a made-up number. This module is the single place the schema lives; docs/trainer-grpo.md
documents it.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# --- event kinds -------------------------------------------------------------------------------------------
KIND_START, KIND_STEP, KIND_EVAL = "start", "step", "eval"
KIND_WARNING, KIND_ERROR, KIND_END = "warning", "error", "end"
KIND_BENCH = "bench"  # a measurement of `python -m trainer bench-memory` (trainer/planner/bench_memory.py)
EVENT_KINDS = (KIND_START, KIND_STEP, KIND_EVAL, KIND_WARNING, KIND_ERROR, KIND_END, KIND_BENCH)

# --- step metric keys (the W&B names) ----------------------------------------------------------------------
PHASES = ("rollout_generate", "reward", "advantages", "shard", "update", "step")


def phase_key(phase: str) -> str:
    return f"time/train/{phase}_s"


STEP = "step"
STEP_AVG_LAST10 = "time/train/step_avg_last10_s"
VALID_TOKENS_PER_S = "throughput/train/valid_tokens_per_s"
VALID_TOKENS = "throughput/train/valid_tokens"
MEM_IN_USE = "memory/train/bytes_in_use_max_gib"
MEM_PEAK = "memory/train/peak_bytes_in_use_max_gib"
MEM_LIMIT = "memory/train/bytes_limit_gib"
# Lists, one entry per local device in jax.local_devices() order (events.jsonl only; W&B gets the maxima).
MEM_IN_USE_PER_DEVICE = "memory/train/bytes_in_use_gib_per_device"
MEM_PEAK_PER_DEVICE = "memory/train/peak_bytes_in_use_gib_per_device"
MEM_LIMIT_PER_DEVICE = "memory/train/bytes_limit_gib_per_device"
REWARD_MEAN = "train-reward/total/mean"
REWARD_STD = "train-reward/total/std"


def reward_fn_key(name: str) -> str:
    return f"train-reward/{name}/mean"


LOSS, ENTROPY, KL, CLIP_FRACTION = "loss", "entropy", "kl", "clip_fraction"
GRAD_NORM, LEARNING_RATE = "train/grad_norm", "train/learning_rate"
COMPLETION_LEN_MEAN = "train/completion_length/mean"
COMPLETION_LEN_MAX = "train/completion_length/max"
COMPILE_COUNT = "compile/count"
COMPILE_CACHE_HITS = "compile/cache_hits"  # loaded from the persistent cache (trainer/compilation_cache.py)
EVAL_ACCURACY = "eval/accuracy"
EVAL_REWARD_MEAN = "eval-reward/total/mean"

GIB = float(1 << 30)


# --- memory ------------------------------------------------------------------------------------------------
def device_memory(devices: list | None = None) -> dict[str, Any]:
    """In-use, peak and limit GiB: the max over this process's devices, and one list entry per local device.

    None (JSON null) wherever `memory_stats()` gives nothing (CPU).
    """
    import jax

    stats = [d.memory_stats() or {} for d in (jax.local_devices() if devices is None else devices)]

    def per_device(field: str) -> list[float | None]:
        return [s[field] / GIB if field in s else None for s in stats]

    def max_of(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    in_use, peak, limit = (per_device(f) for f in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit"))
    return {MEM_IN_USE: max_of(in_use), MEM_PEAK: max_of(peak), MEM_LIMIT: max_of(limit),
            MEM_IN_USE_PER_DEVICE: in_use, MEM_PEAK_PER_DEVICE: peak, MEM_LIMIT_PER_DEVICE: limit}


# --- compile count -----------------------------------------------------------------------------------------
class CompileCounter:
    """Counts XLA backend compilations in this process (all jitted functions, the sampler's included)."""

    _EVENT = "/jax/core/compile/backend_compile_duration"
    _CACHE_HIT = "/jax/compilation_cache/cache_hits"

    def __init__(self) -> None:
        import jax.monitoring

        self.count = 0
        self.cache_hits = 0  # of those, how many the persistent cache answered
        jax.monitoring.register_event_duration_secs_listener(self._on_event)
        jax.monitoring.register_event_listener(self._on_cache_event)

    def _on_event(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == self._EVENT:
            self.count += 1

    def _on_cache_event(self, event: str, **kwargs: Any) -> None:
        if event == self._CACHE_HIT:
            self.cache_hits += 1


# --- phase timing ------------------------------------------------------------------------------------------
class PhaseTimer:
    """Wall time of named phases; `fence(x)` blocks on device work so async dispatch is not mistaken for
    speed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._history: deque[float] = deque(maxlen=10)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    @staticmethod
    def fence(value: Any) -> Any:
        import jax

        return jax.block_until_ready(value)

    def reset(self) -> None:
        self.seconds = {}

    def record_step(self, step_s: float) -> float:
        """Add a finished step's time; returns the mean of the last 10 steps."""
        self._history.append(step_s)
        return sum(self._history) / len(self._history)


# --- events.jsonl ------------------------------------------------------------------------------------------
def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy / jax scalars
        return _jsonable(value.item())
    return str(value)


class EventLog:
    """Appends events to `<run_dir>/events.jsonl`, one flushed line each (the console tails this file)."""

    def __init__(self, run_dir: str | Path | None, process: int) -> None:
        self.process = process
        self.path = Path(run_dir).expanduser() / "events.jsonl" if run_dir is not None else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, kind: str, **fields: Any) -> dict:
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        event = {"t": time.time(), "kind": kind, "process": self.process, **_jsonable(fields)}
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(event, allow_nan=False) + "\n")
        return event


# --- human line --------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def human_step_line(metrics: Mapping[str, Any]) -> str:
    """`step=N loss=... entropy=... reward_mean=... dt=12.34s rollout_generate=9.10s reward=0.01s ...`."""
    parts = [f"step={metrics[STEP]}", f"loss={_fmt(metrics.get(LOSS))}",
             f"entropy={_fmt(metrics.get(ENTROPY))}", f"kl={_fmt(metrics.get(KL))}",
             f"reward_mean={_fmt(metrics.get(REWARD_MEAN))}",
             f"dt={metrics[phase_key('step')]:.2f}s"]
    parts += [f"{p}={metrics[phase_key(p)]:.2f}s" for p in PHASES if p != "step" and phase_key(p) in metrics]
    parts.append(f"tokens_per_s={_fmt(metrics.get(VALID_TOKENS_PER_S))}")
    return " ".join(parts)


# --- W&B ---------------------------------------------------------------------------------------------------
class WandbSink:
    """Same metrics to W&B from process 0. With mode=disabled wandb is never imported (no network at all)."""

    def __init__(self, mode: str, project: str | None, name: str | None, config: dict, process: int,
                 run_dir: str | Path | None) -> None:
        self._run = None
        if mode == "disabled" or process != 0:
            return
        import wandb  # the API key comes from WANDB_API_KEY / netrc; it is never read or logged here

        self._run = wandb.init(project=project, name=name, mode=mode, config=config,
                               dir=str(Path(run_dir).expanduser()) if run_dir else None)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._run is not None:
            self._run.log({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step=step)

    def finish(self, exit_code: int = 0) -> None:
        if self._run is not None:
            self._run.finish(exit_code=exit_code)
            self._run = None
