"""Seconds from a preemption notice to a complete checkpoint, on this machine's CPU.

    python benchmarks/preemption_checkpoint.py [--runs 2] [--blocks 2,4] [--skip-tiny]

1. The tiny config (trainer/configs/tiny_local.yaml, a tiny model made here), through the whole chain as on a
   pod: a fake metadata server on 127.0.0.1, the job runner (tpu_console/worker/job_runner.py, its notice
   watch pointed at the server by GCE_METADATA_HOST) running the bundled trainer; after step 2,
   `instance/preempted` turns TRUE. Measured: flip -> the runner's notice (the watch), notice -> the
   checkpoint complete on disk (the trainer's own event), flip -> the job ended.
2. The Qwen2.5-3B shape: its whole training state (fp32 weights and AdamW's two moments, ~37 GB) does not fit
   this machine's memory, so the measure is the trainer's stop save (`Checkpointer.save_now`, the code the
   trainer runs on SIGTERM) of the state of the first N of the 3B's 36 blocks, random values in the shapes
   of the model's own parameter tree; the seconds for the whole state, and for one host's part of it on a
   v6e-16 (4 hosts, each writing its own shards), are extrapolated from the rate measured, and printed as
   such.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fake_metadata import FakeMetadata  # noqa: E402 - after the path
from tpu_console.fleet.run_recipes import RUNNER_MODULES  # noqa: E402
from tpu_console.worker import HERE as WORKER_DIR  # noqa: E402
from tpu_console.worker.preemption_notice import METADATA_HOST_ENV, PREEMPTED_KEY  # noqa: E402

TINY_CONFIG = REPO / "trainer" / "configs" / "tiny_local.yaml"
BLOCKS_3B = 36
V6E16_HOSTS = 4


def events(folder: Path) -> list[dict]:
    path = folder / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def tiny_run(root: Path, model: Path, data: Path, index: int) -> dict:
    """One run of the tiny trainer under the job runner, preempted after step 2."""
    folder = root / f"run-{index}"
    folder.mkdir()
    # as launch ships them (fleet/run_recipes.py)
    for name in RUNNER_MODULES:
        shutil.copy(WORKER_DIR / name, folder / name)
    (folder / "launch.json").write_text(json.dumps({"worker": 0, "provider": "local",
                                                    "job": {"kind": "trainer"}}))
    (folder / "supervision.json").write_text("{}")
    ckpt = root / f"ckpt-{index}"
    sets = [f"model_path={model}", f"data.path={data}", "steps=500", "eval_every_steps=0",
            f"checkpoint.dir={ckpt}", "checkpoint.every_steps=0"]
    command = [sys.executable, "-u", "-m", "trainer", "--config", str(TINY_CONFIG), "--run-dir", "."]
    command += [arg for value in sets for arg in ("--set", value)]
    metadata = FakeMetadata()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO), METADATA_HOST_ENV: metadata.host}
    with (folder / "output.log").open("ab") as log:
        runner = subprocess.Popen([sys.executable, "job_runner.py", "--", *command], cwd=folder, env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 600
        while not any(e.get("kind") == "step" and e["step"] >= 2 for e in events(folder)):
            if runner.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the tiny run did not reach step 2:\n{(folder / 'output.log').read_text()}")
            time.sleep(0.05)
        flipped = time.time()
        metadata.flip(PREEMPTED_KEY, "TRUE")
        job_pid = int((folder / "job.pid").read_text())
        while Path(f"/proc/{job_pid}").exists() and _alive(job_pid):
            time.sleep(0.01)
        job_ended = time.time()
        runner.wait(timeout=60)
    finally:
        runner.kill()
        metadata.close()
    seen = events(folder)
    notice = next(e for e in seen if e["kind"] == "preemption")
    saved = next(e for e in seen if e.get("checkpoint_step"))
    return {"step": saved["checkpoint_step"], "watch_s": notice["seen_at"] - flipped,
            "notice_to_checkpoint_s": saved["notice_to_checkpoint_s"], "save_s": saved["checkpoint_save_s"],
            "flip_to_exit_s": job_ended - flipped, "seconds_left": saved["seconds_left"],
            "checkpoint_bytes": _bytes(ckpt)}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def shape_3b_save(root: Path, blocks: int) -> dict:
    """The stop save of the first `blocks` blocks' training state of Qwen2.5-3B (fp32 params, AdamW mu/nu)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from trainer.checkpoint import Checkpointer
    from trainer.model import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config.preset("qwen2.5-3b")
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(lambda: Qwen2ForCausalLM(config, nnx.Rngs(0), param_dtype=jnp.float32))
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    total = sum(leaf.size for _, leaf in flat)
    # paths as ['layers'][i][...]: the blocks below `blocks`, named by their path
    chosen = {jax.tree_util.keystr(path): leaf for path, leaf in flat
              if getattr(path[0], "key", None) == "layers" and path[1].key < blocks}
    rng = np.random.default_rng(0)

    def filled(scale: float) -> dict:
        return {name: jnp.asarray(rng.standard_normal(leaf.shape, np.float32) * scale)
                for name, leaf in chosen.items()}

    state = {"params": filled(0.02), "opt_state": {"mu": filled(1e-4), "nu": filled(1e-8),
                                                   "count": jnp.asarray(7, jnp.int32)}}
    state_bytes = 3 * sum(leaf.size * 4 for leaf in chosen.values())
    ckpt = root / f"ckpt-3b-{blocks}"
    checkpointer = Checkpointer(str(ckpt), 0, 2)
    started = time.perf_counter()
    checkpointer.save_now(1, state)
    seconds = time.perf_counter() - started
    checkpointer.close()
    written = _bytes(ckpt)
    del state
    shutil.rmtree(ckpt)
    params = sum(leaf.size for leaf in chosen.values())
    return {"blocks": blocks, "params": params, "state_bytes": state_bytes, "written_bytes": written,
            "seconds": seconds, "total_params_3b": total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="tiny runs (each compiles the tiny programs)")
    parser.add_argument("--blocks", default="2,4", help="3B blocks whose state is saved, one save each")
    parser.add_argument("--skip-tiny", action="store_true")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="preemption-ckpt-"))
    try:
        if not args.skip_tiny:
            from trainer.synthetic_gsm8k import write_jsonl
            from trainer.tiny_model import main as make_tiny

            make_tiny([str(root / "tiny-qwen2")])
            data = write_jsonl(root / "gsm8k.jsonl", 256, 0)
            print("tiny config (trainer/configs/tiny_local.yaml), the job runner's watch of a fake metadata "
                  "server, CPU:")
            print(f"{'run':>3} {'step':>4} {'flip->notice s':>14} {'notice->ckpt s':>14} {'save s':>7} "
                  f"{'flip->exit s':>12} {'left s':>6} {'bytes':>9}")
            for i in range(args.runs):
                r = tiny_run(root, root / "tiny-qwen2", data, i)
                print(f"{i:>3} {r['step']:>4} {r['watch_s']:>14.3f} {r['notice_to_checkpoint_s']:>14.3f} "
                      f"{r['save_s']:>7.3f} {r['flip_to_exit_s']:>12.3f} {r['seconds_left']:>6.1f} "
                      f"{r['checkpoint_bytes']:>9}", flush=True)
        print("\nQwen2.5-3B shape, the trainer's stop save (Checkpointer.save_now) of the first N of 36 "
              "blocks' state (fp32 params + AdamW mu, nu), random values, CPU, local disk:")
        print(f"{'blocks':>6} {'params':>12} {'state GB':>9} {'written GB':>10} {'save s':>7} {'GB/s':>6}")
        rates, total = [], None
        for blocks in (int(b) for b in args.blocks.split(",")):
            r = shape_3b_save(root, blocks)
            total = r["total_params_3b"]
            rates.append(r["state_bytes"] / r["seconds"])
            print(f"{r['blocks']:>6} {r['params']:>12,} {r['state_bytes'] / 1e9:>9.2f} "
                  f"{r['written_bytes'] / 1e9:>10.2f} {r['seconds']:>7.2f} "
                  f"{r['state_bytes'] / r['seconds'] / 1e9:>6.2f}", flush=True)
        whole = 3 * 4 * total
        rate = min(rates)
        print(f"\nextrapolated at the slowest rate measured ({rate / 1e9:.2f} GB/s), not measured: the whole "
              f"3B state ({total:,} params, {whole / 1e9:.1f} GB) in {whole / rate:.0f} s on one host; one "
              f"host's part on a v6e-16 ({V6E16_HOSTS} hosts, {whole / V6E16_HOSTS / 1e9:.1f} GB) in "
              f"{whole / V6E16_HOSTS / rate:.0f} s, against the ~30 s of a preemption notice")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
