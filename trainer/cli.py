"""`python -m trainer`: the GRPO job the console launches on every host, plus two helper subcommands.

    python -m trainer --config FILE.yaml [--set a.b=value ...] [--print-config] [--run-dir DIR]
    python -m trainer make-tiny-model DIR          (a tiny offline Qwen2 model; trainer/tiny_model.py)
    python -m trainer make-gsm8k-jsonl PATH [--n N] [--seed S]   (synthetic GSM8K-format data)
    python -m trainer bench-memory [--mesh-shape M] [--mode sharded|gather] [--target-bytes-gib X]
                                   (per-device bytes of FSDP-sharded vs gathered weights;
                                   trainer/planner/bench_memory.py)
    python -m trainer plan --config FILE.yaml [--set ...] --topology v6e-16 [--json]
                                   (every program compiled for a TPU slice by libtpu, no TPU needed: per-chip
                                   memory, verdict, cost; exit 0 fits, 1 does not, 3 no libtpu;
                                   trainer/planner/plan.py)

Exit status: 0 when the run finished, 2 for a config or launch problem (one line naming the key and the fix),
128+N when stopped by signal N (SIGTERM, SIGINT; with checkpoints on, after saving the last finished step:
trainer/stop.py), 1 for anything else. Every failure also lands in
events.jsonl as an `error` event.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from trainer import stop
from trainer.config import ConfigError, check_environment, dump_yaml, load_config
from trainer.distributed import LaunchError, Terminated, process_id_hint, read_launch_env
from trainer.telemetry import KIND_ERROR, EventLog

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
OOM_HINT = ("out of device memory: reduce rollout.batch_size or rollout.n (local_batch), shorten "
            "rollout.max_length_sample, lower train.micro_batch_size_per_device, or shard the model wider "
            "(a larger fsdp axis in mesh_shape)")


def _train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="GRPO on GSM8K (Qwen2.5, JAX). Subcommands: make-tiny-model DIR, make-gsm8k-jsonl PATH.")
    parser.add_argument("--config", required=True, help="YAML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set rollout.n=8 (repeatable)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the validated config (with defaults) and its digest, then exit")
    parser.add_argument("--run-dir", default=None, help="folder for events.jsonl (the console passes '.')")
    return parser


def _make_gsm8k_jsonl(argv: Sequence[str]) -> int:
    from trainer.synthetic_gsm8k import write_jsonl

    parser = argparse.ArgumentParser(prog="python -m trainer make-gsm8k-jsonl",
                                     description="Write synthetic GSM8K-format problems as JSON lines.")
    parser.add_argument("path")
    parser.add_argument("--n", type=int, default=2000, help="number of problems (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = write_jsonl(args.path, args.n, args.seed)
    print(f"wrote {args.n} problems to {out}")
    return EXIT_OK


def _bench_memory(argv: Sequence[str]) -> int:
    """The FSDP memory bench (trainer/planner/bench_memory.py), with the same exit statuses and error events
    as a run."""
    events = EventLog(_run_dir_of(argv), process_id_hint())
    try:
        from trainer.planner.bench_memory import main as bench_main

        return bench_main(argv, events)
    except (ConfigError, LaunchError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        events.emit(KIND_ERROR, **error_fields(exc, None))
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - every failure must reach events.jsonl and the exit status
        traceback.print_exc()
        events.emit(KIND_ERROR, **error_fields(exc, None))
        return EXIT_FAILED


def _run_dir_of(argv: Sequence[str]) -> str | None:
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--run-dir" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--run-dir="):
            return arg.split("=", 1)[1]
    return None


def error_fields(exc: BaseException, local_batch: int | None) -> dict:
    """The `error` event's fields: type, one-line message, and for OOM the local batch and a hint."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    fields = {"type": type(exc).__name__, "message": message[:2000]}
    if "RESOURCE_EXHAUSTED" in str(exc) or "out of memory" in str(exc).lower():
        fields.update(resource_exhausted=True, local_batch=local_batch, hint=OOM_HINT)
    return fields


STACKS_FILE = "stacks.txt"


def dump_stacks_on_sigusr1(run_dir: str | None) -> None:
    """SIGUSR1 appends every thread's Python stack to `stacks.txt` in the run folder (`tpu-console stacks`
    asks for it; faulthandler writes even while the main thread is blocked in a collective)."""
    if run_dir is None or not hasattr(signal, "SIGUSR1"):
        return
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        out = open(Path(run_dir) / STACKS_FILE, "a")  # noqa: SIM115 - open for the process's life
    except OSError:
        return  # no stacks on demand; the run itself goes on
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=False)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "make-tiny-model":
        from trainer.tiny_model import main as tiny_main

        return tiny_main(argv[1:])
    if argv and argv[0] == "make-gsm8k-jsonl":
        return _make_gsm8k_jsonl(argv[1:])
    if argv and argv[0] == "bench-memory":
        return _bench_memory(argv[1:])
    if argv and argv[0] == "plan":
        from trainer.planner.plan import main as plan_main

        return plan_main(argv[1:])

    args = _train_parser().parse_args(argv)
    progress: dict = {}  # filled by the run (local batch) for the error event; stop_signal by the handler
    events = EventLog(args.run_dir, process_id_hint())
    dump_stacks_on_sigusr1(args.run_dir)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.print_config:
            print(dump_yaml(cfg), end="")
            print(f"# digest: {cfg.digest()}")
            return EXIT_OK
        check_environment(cfg)
        launch = read_launch_env()
        # From here a stop becomes an exception (after a checkpoint when checkpoints are on: trainer/stop.py),
        # so the run still writes its `error` event on the way out.
        signal.signal(signal.SIGTERM, stop.handler(progress))
        signal.signal(signal.SIGINT, stop.handler(progress))
        from trainer import compilation_cache
        from trainer.train import run  # imports JAX; only after the config passed

        compilation_cache.enable()

        run(cfg, launch, events, run_dir=args.run_dir, progress=progress)
        return EXIT_OK
    except Terminated as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        events.emit(KIND_ERROR, **error_fields(exc, progress.get("local_batch")))
        return 128 + exc.signum
    except (ConfigError, LaunchError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        events.emit(KIND_ERROR, **error_fields(exc, progress.get("local_batch")))
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - every failure must reach events.jsonl and the exit status
        traceback.print_exc()
        fields = error_fields(exc, progress.get("local_batch"))
        if fields.get("resource_exhausted"):
            print(f"error: {fields['hint']} (local_batch={fields['local_batch']})", file=sys.stderr,
                  flush=True)
        events.emit(KIND_ERROR, **fields)
        return EXIT_FAILED
