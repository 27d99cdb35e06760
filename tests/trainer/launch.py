"""Launching `python -m trainer` the way the console does: N processes with the TRAINER_* environment,
JAX on CPU with D devices each, every process writing events.jsonl into its own run folder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainer.synthetic_gsm8k import write_jsonl

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_config(tmp_path: Path, model_dir: Path, **overrides: object) -> Path:
    """A config for the tiny model on a small synthetic dataset: short prompts and completions."""
    data = tmp_path / "gsm8k.jsonl"
    if not data.exists():
        write_jsonl(data, 64, seed=0)
    cfg = {
        "model_path": str(model_dir), "steps": 2, "seed": 0, "mesh_shape": "auto",
        "data": {"path": str(data)},
        "rollout": {"batch_size": 4, "n": 4, "global_length": 160, "max_length_sample": 8},
        "train": {"learning_rate": 1e-3, "compute_dtype": "float32", "remat": False},
        "wandb_mode": "disabled",
    }
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@dataclass
class ProcessResult:
    returncode: int
    output: str
    events: list[dict]


def read_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class Spawned:
    proc: subprocess.Popen
    log_path: Path
    run_dir: Path


def spawn(tmp_path: Path, config: Path, processes: int, devices: int, *,
          extra_env: dict[str, str] | None = None, distributed: bool = True, tag: str = "run",
          trainer_args: list[str] | None = None) -> list[Spawned]:
    """Start `processes` trainer processes (the TRAINER_* environment the console sets) without waiting.
    `trainer_args` replaces `--config CONFIG` (e.g. `bench-memory ...`); `--run-dir` is added either way."""
    port = free_port()
    spawned = []
    for i in range(processes):
        run_dir = tmp_path / f"{tag}-p{i}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINER_", "XLA_", "JAX_"))}
        env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
                   PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", WANDB_MODE="disabled",
                   # a broken multi-process run must fail in seconds, not after JAX's 5-minute default
                   TRAINER_DISTRIBUTED_INIT_TIMEOUT_S="60", TRAINER_DISTRIBUTED_HEARTBEAT_TIMEOUT_S="30")
        if distributed:
            env.update(TRAINER_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", TRAINER_NUM_PROCESSES=str(processes),
                       TRAINER_PROCESS_ID=str(i), TRAINER_REQUIRE_PROCESS_COUNT=str(processes))
        env.update(extra_env or {})
        log_path = tmp_path / f"{tag}-p{i}.log"
        with log_path.open("w") as log:
            args = trainer_args if trainer_args is not None else ["--config", str(config)]
            proc = subprocess.Popen([sys.executable, "-m", "trainer", *args, "--run-dir", str(run_dir)],
                                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        spawned.append(Spawned(proc, log_path, run_dir))
    return spawned


def wait_all(spawned: list[Spawned], timeout: float) -> list[ProcessResult]:
    """Wait for every process (killing all of them at the deadline); exit status, output and events each."""
    deadline = time.monotonic() + timeout
    for s in spawned:
        try:
            s.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in spawned:
                other.proc.kill()
            s.proc.wait()
    return [ProcessResult(s.proc.returncode, s.log_path.read_text(), read_events(s.run_dir)) for s in spawned]


def launch(tmp_path: Path, config: Path, processes: int, devices: int, *, timeout: float = 240,
           extra_env: dict[str, str] | None = None, distributed: bool = True,
           tag: str = "run") -> list[ProcessResult]:
    """Run `processes` trainer processes to completion."""
    spawned = spawn(
        tmp_path, config, processes, devices, extra_env=extra_env, distributed=distributed, tag=tag
    )
    return wait_all(spawned, timeout)


def planning_config(tmp_path: Path, model_dir: Path, **rollout: object) -> str:
    """A config file for planning the tiny model (bf16 compute, as on a TPU); `rollout` keys override."""
    import yaml

    raw = {
        "model_path": str(model_dir),
        "steps": 2,
        "mesh_shape": "auto",
        "rollout": {"batch_size": 4, "n": 4, "global_length": 64, "max_length_sample": 32, **rollout},
        "train": {"micro_batch_size_per_device": 2, "compute_dtype": "bfloat16"},
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)
