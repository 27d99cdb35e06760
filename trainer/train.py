"""The GRPO loop every process runs: rollout, reward, advantages, shard, update, telemetry, eval, checkpoints.

Each step: this process's prompts (repeated n times) are sampled together with every other process's as one
global batch; each process scores its own completions, normalises advantages within each prompt's group,
and the update runs on the global batch (micro-batched, ppo_epochs passes). Phase times are fenced with
`block_until_ready`, so they measure device work, not dispatch.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trainer import telemetry as tm
from trainer.config import ConfigError, TrainerConfig, check_topology, prompts_per_process
from trainer.distributed import LaunchEnv, Terminated, initialize_or_explain, require_process_count
from trainer.fault_injection import armed_step_fault, raise_armed_faults
from trainer.grpo import group_advantages
from trainer.mesh import (
    MeshError,
    axis_sizes,
    fsdp_spans_hosts,
    global_from_local_rows,
    local_rows,
    make_mesh,
    reshard,
    train_sharding,
)
from trainer.programs import DTYPES, build_programs
from trainer.rollout.layouts import RolloutLayout, resolve_rollout_layout
from trainer.stop import StopGate, notice


@dataclasses.dataclass
class Topology:
    process_index: int
    process_count: int
    device_count: int
    local_device_count: int


def _gather(local: np.ndarray) -> np.ndarray:
    """Every process's rows of a small host array, concatenated in process order."""
    if jax.process_count() == 1:
        return local
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(local, tiled=True))


def _cycle(items: list, count: int) -> list:
    return [items[i % len(items)] for i in range(count)]


def run(cfg: TrainerConfig, launch: LaunchEnv, events: tm.EventLog, *, run_dir: str | None,
        progress: dict) -> None:
    """Train for cfg.steps steps. Raises on any failure (the CLI turns it into an error event)."""
    expected = launch.require_process_count or cfg.require_process_count
    initialize_or_explain(launch, expected)
    require_process_count(expected, jax.process_count())
    topo = Topology(jax.process_index(), jax.process_count(), jax.device_count(), jax.local_device_count())
    events.process = topo.process_index
    try:
        mesh = make_mesh(cfg.mesh_shape)
    except MeshError as exc:
        raise ConfigError(f"invalid config for this pod: {exc}") from None
    sizes = axis_sizes(mesh)
    check_topology(cfg, topo.process_count, topo.local_device_count, sizes["dp"], sizes["fsdp"])
    per_process = prompts_per_process(cfg, topo.process_count)
    local_batch = per_process * cfg.rollout.n
    progress["local_batch"] = local_batch
    spans = fsdp_spans_hosts(mesh)
    if spans:
        print(f"info: the fsdp axis ({sizes['fsdp']} devices) spans {topo.process_count} hosts: parameter "
              "all-gathers cross hosts (mesh_shape host_local keeps them on-host)", flush=True)
    compiles = tm.CompileCounter()
    rollout_layout = _rollout_layout(cfg, mesh)  # what `auto` chose, recorded before the weights load
    events.emit(tm.KIND_START, jax_version=jax.__version__, backend=jax.default_backend(),
                process_count=topo.process_count, device_count=topo.device_count,
                local_device_count=topo.local_device_count, mesh_shape=cfg.mesh_shape, mesh_axes=sizes,
                fsdp_spans_hosts=spans, local_batch=local_batch,
                global_batch=local_batch * topo.process_count,
                rollout_layout=rollout_layout.to_json(),
                steps=cfg.steps, config_digest=cfg.digest())
    raise_armed_faults(local_batch)  # tests only (trainer/fault_injection.py)
    print(f"backend={jax.default_backend()} process={topo.process_index}/{topo.process_count} "
          f"device_count={topo.device_count} local_device_count={topo.local_device_count} "
          f"mesh={sizes} local_batch={local_batch}", flush=True)
    print(f"info: rollout layout {rollout_layout.weight_layout} ({rollout_layout.why})", flush=True)
    with jax.set_mesh(mesh):  # the model's activation constraints name the axes of the mesh in context
        Trainer(cfg, mesh, topo, events, compiles, run_dir, progress, rollout_layout=rollout_layout).train()


def _rollout_layout(cfg: TrainerConfig, mesh: jax.sharding.Mesh) -> RolloutLayout:
    """The rollout layout `cfg` resolves to on `mesh` (rollout/layouts.resolve_rollout_layout), from the
    model's config.json (a hub id's files are downloaded here, where the loader would download them)."""
    import json

    from trainer.model import Qwen2Config
    from trainer.weights import resolve_model_dir

    config = Qwen2Config.from_hf(json.loads((resolve_model_dir(cfg.model_path) / "config.json").read_text()))
    r = cfg.rollout
    return resolve_rollout_layout(r.weight_layout, config, mesh, mesh_shape=cfg.mesh_shape,
                                  copies=r.weight_copies)


class Trainer:
    def __init__(self, cfg: TrainerConfig, mesh: jax.sharding.Mesh, topo: Topology, events: tm.EventLog,
                 compiles: tm.CompileCounter, run_dir: str | None, progress: dict | None = None, *,
                 rollout_layout: RolloutLayout | None = None) -> None:
        """rollout_layout: the layout `run` resolved and recorded (None: resolved with the sampler)."""
        from trainer.data import load_problems, process_shard
        from trainer.tokenizer import eos_token_ids, load_tokenizer
        from trainer.weights import load_model

        self.cfg, self.mesh, self.topo, self.events, self.compiles = cfg, mesh, topo, events, compiles
        self.progress = {} if progress is None else progress
        t = cfg.train
        # scan_layers: every block's weights stacked [layers, ...], the forward one scan (trainer/scanned.py);
        # the sampler (then a StackedWeightsSampler) casts and lays them out still stacked, and its prefill
        # and decode scan over the layers too (rollout_weights_program).
        self.model, self.model_config = load_model(cfg.model_path, mesh=mesh,
                                                   compute_dtype=DTYPES[t.compute_dtype], remat=t.remat,
                                                   scan_layers=t.scan_layers)
        self.tokenizer = load_tokenizer(cfg.model_path)
        self.train_problems = process_shard(load_problems(cfg.data, cfg.data.split), topo.process_index,
                                            topo.process_count)
        self.eval_problems = (process_shard(load_problems(cfg.data, cfg.data.eval_split), topo.process_index,
                                            topo.process_count) if cfg.eval_every_steps else [])
        eos = eos_token_ids(self.tokenizer, self.model_config.eos_token_ids)
        programs = build_programs(cfg, self.model, mesh, pad_id=self.tokenizer.pad_token_id, eos_ids=eos,
                                  rollout_layout=rollout_layout)
        self.graphdef, self.params, self.rest = nnx.split(self.model, nnx.Param, ...)
        self.sampler, self.step_fn = programs.sampler, programs.step_fn
        self.schedule, self.optimizer = programs.schedule, programs.optimizer
        self.opt_state = programs.init_optimizer(self.params)
        # The frozen reference is a copy of the starting weights (only when the KL term is on).
        self.ref_params = jax.tree.map(jnp.copy, self.params) if t.beta > 0 else None
        self.checkpointer = None
        if cfg.checkpoint.dir:
            from trainer.checkpoint import Checkpointer

            self.checkpointer = Checkpointer(cfg.checkpoint.dir, cfg.checkpoint.every_steps,
                                             cfg.checkpoint.max_to_keep)
        self.wandb = tm.WandbSink(cfg.wandb_mode, cfg.wandb_project, cfg.wandb_name,
                                  cfg.model_dump(mode="json"), topo.process_index, run_dir)
        self.timer = tm.PhaseTimer()
        self.key = jax.random.key(cfg.seed)
        self.gate = StopGate(self.progress, topo.process_count, self.checkpointer is not None)
        self.done_step = 0  # the last step whose update finished: the state a stop saves
        self._warned_truncation = False

    # ---- helpers ----------------------------------------------------------------------------------------

    def _sampler_state(self) -> nnx.State:
        """The weights the rollout is given: the training state as it is (stacked, for a scanned model: the
        sampler keeps them stacked for its scanned rollout, scanned.StackedWeightsSampler)."""
        return nnx.merge_state(self.params, self.rest)

    def _prompt_tokens(self, problems: list) -> list[list[int]]:
        from trainer.data import SYSTEM_PROMPT
        from trainer.tokenizer import encode_chat_prompts

        tokens = encode_chat_prompts(self.tokenizer, [p.question for p in problems], system=SYSTEM_PROMPT)
        limit = self.cfg.rollout.global_length
        if any(len(t) > limit for t in tokens) and not self._warned_truncation:
            self._warned_truncation = True
            longest = max(len(t) for t in tokens)
            self.events.emit(tm.KIND_WARNING, message=f"prompts of up to {longest} tokens truncated to "
                             f"rollout.global_length={limit} (keeping their end); raise global_length")
        return [t[-limit:] for t in tokens]

    def _completion_texts(self, ids: np.ndarray, mask: np.ndarray) -> list[str]:
        rows = [row[m.astype(bool)].tolist() for row, m in zip(ids, mask, strict=True)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    # ---- one step ---------------------------------------------------------------------------------------

    def _step(self, step: int, problems: list) -> dict:
        from trainer.rewards import score_batch

        cfg, timer, n = self.cfg, self.timer, self.cfg.rollout.n
        timer.reset()
        start = time.perf_counter()
        group_problems = [p for p in problems for _ in range(n)]  # each prompt's n samples are adjacent
        with timer.phase("rollout_generate"):
            r = cfg.rollout
            rollout = self.sampler.generate(self._prompt_tokens(group_problems),
                                            jax.random.fold_in(self.key, step),
                                            temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                                            state=self._sampler_state())
            timer.fence(rollout)
        with timer.phase("reward"):
            ids = local_rows(rollout.completion_ids, self.mesh)
            mask = local_rows(rollout.completion_mask, self.mesh)
            texts = self._completion_texts(ids, mask)
            rewards, per_fn = score_batch(texts, [p.answer for p in group_problems], cfg.reward_weights)
        with timer.phase("advantages"):
            advantages = group_advantages(rewards, n)
        with timer.phase("shard"):
            batch = self._train_batch(rollout, advantages)
            timer.fence(batch)
        with timer.phase("update"):
            self.gate.hold()  # a stop waits (the update donates the weights) until the loop records the step
            update_metrics = self._update(batch)
            self.done_step = step
        step_s = time.perf_counter() - start
        timer.seconds["step"] = step_s
        return self._step_metrics(step, step_s, rewards, per_fn, mask, update_metrics)

    def _train_batch(self, rollout: Any, advantages: np.ndarray) -> dict:
        layout = train_sharding(self.mesh)
        tokens = reshard({"prompt_ids": rollout.prompt_ids, "prompt_mask": rollout.prompt_mask,
                          "completion_ids": rollout.completion_ids,
                          "completion_mask": rollout.completion_mask},
                         layout)
        batch = _assemble(tokens)
        batch["advantages"] = global_from_local_rows(advantages.astype(np.float32), self.mesh, layout)
        return batch

    def _update(self, batch: dict) -> dict:
        t = self.cfg.train
        if self.ref_params is not None:
            batch["ref_logprobs"] = self.step_fn.logprobs(self.ref_params, self.rest, batch)
        if t.ppo_epochs > 1:  # later epochs need the log-probs of the policy that sampled
            batch["old_logprobs"] = self.step_fn.logprobs(self.params, self.rest, batch)
        totals: dict[str, float] = {}
        for _ in range(t.ppo_epochs):
            self.params, self.opt_state, metrics = self.step_fn.update(self.params, self.rest, self.opt_state,
                                                                       batch)
            metrics = jax.device_get(self.timer.fence(metrics))
            for k, v in metrics.items():
                totals[k] = totals.get(k, 0.0) + float(v) / t.ppo_epochs
        return totals

    def _step_metrics(self, step: int, step_s: float, rewards: np.ndarray, per_fn: dict, mask: np.ndarray,
                      update: dict) -> dict:
        all_rewards = _gather(rewards)
        lengths = _gather(mask.sum(axis=1).astype(np.int32))
        fn_means = {name: float(_gather(v).mean()) for name, v in per_fn.items()}
        valid_tokens = int(lengths.sum())
        metrics: dict[str, Any] = {tm.STEP: step}
        metrics.update({tm.phase_key(p): self.timer.seconds.get(p, 0.0) for p in tm.PHASES})
        metrics[tm.STEP_AVG_LAST10] = self.timer.record_step(step_s)
        metrics[tm.VALID_TOKENS] = valid_tokens
        metrics[tm.VALID_TOKENS_PER_S] = valid_tokens / step_s if step_s > 0 else None
        metrics.update(tm.device_memory())
        metrics[tm.REWARD_MEAN] = float(all_rewards.mean())
        metrics[tm.REWARD_STD] = float(all_rewards.std())
        metrics.update({tm.reward_fn_key(name): value for name, value in fn_means.items()})
        metrics[tm.LOSS], metrics[tm.ENTROPY] = update["loss"], update["entropy"]
        metrics[tm.KL], metrics[tm.CLIP_FRACTION] = update["kl"], update["clip_fraction"]
        metrics[tm.GRAD_NORM] = update["grad_norm"]
        metrics[tm.LEARNING_RATE] = float(self.schedule(step * self.cfg.train.ppo_epochs - 1))
        metrics[tm.COMPLETION_LEN_MEAN] = float(lengths.mean())
        metrics[tm.COMPLETION_LEN_MAX] = int(lengths.max())
        metrics[tm.COMPILE_COUNT] = self.compiles.count
        metrics[tm.COMPILE_CACHE_HITS] = self.compiles.cache_hits
        return metrics

    # ---- eval -------------------------------------------------------------------------------------------

    def _eval(self, step: int) -> dict:
        from trainer.rewards import correct_reward, score_batch

        cfg = self.cfg
        start = time.perf_counter()
        # Equal row counts on every process, a multiple of the local devices; padding rows are not scored.
        wanted = math.ceil(cfg.eval_samples / self.topo.process_count)
        rows = math.ceil(wanted / self.topo.local_device_count) * self.topo.local_device_count
        problems = _cycle(self.eval_problems, rows)
        rollout = self.sampler.generate(self._prompt_tokens(problems), self.key, greedy=True,
                                        state=self._sampler_state())
        ids = local_rows(rollout.completion_ids, self.mesh)[:wanted]
        mask = local_rows(rollout.completion_mask, self.mesh)[:wanted]
        texts = self._completion_texts(ids, mask)
        golds = [p.answer for p in problems[:wanted]]
        correct = np.array([correct_reward(c, g) for c, g in zip(texts, golds, strict=True)], np.float32)
        total, _ = score_batch(texts, golds, cfg.reward_weights)
        metrics = {tm.STEP: step, tm.EVAL_ACCURACY: float(_gather(correct).mean()),
                   tm.EVAL_REWARD_MEAN: float(_gather(total).mean()),
                   "eval/samples": wanted * self.topo.process_count,
                   "time/eval/total_s": time.perf_counter() - start}
        return metrics

    # ---- the loop ---------------------------------------------------------------------------------------

    def _resume(self) -> int:
        if self.checkpointer is None or not self.cfg.checkpoint.resume:
            return 0
        latest = self.checkpointer.latest_step()
        if latest is None:
            return 0
        state = self.checkpointer.restore(latest, {"params": self.params, "opt_state": self.opt_state})
        self.params, self.opt_state = state["params"], state["opt_state"]
        print(f"resumed from checkpoint step {latest} in {self.cfg.checkpoint.dir}", flush=True)
        self.events.emit(tm.KIND_WARNING, message=f"resumed from checkpoint step {latest}",
                         resumed_step=latest)
        return latest

    def _save_on_stop(self, first: int) -> None:
        """The checkpoint of a stop: the last finished step, complete on disk before the process ends; its
        event says how long it took, from the signal and from the preemption notice when there was one."""
        if self.checkpointer is None or self.done_step <= first:
            return  # nothing done since the checkpoint this run resumed from
        self.progress["defer_stop"] = True  # a second SIGTERM (the VM's shutdown after the notice) waits too
        signalled_at = self.progress.get("stop_at") or time.time()
        started = time.time()
        self.checkpointer.save_now(self.done_step, {"params": self.params, "opt_state": self.opt_state})
        done = time.time()
        fields = {"checkpoint_step": self.done_step, "checkpoint_save_s": round(done - started, 3),
                  "signal_to_checkpoint_s": round(done - signalled_at, 3)}
        if (seen := notice()) is not None and isinstance(seen.get("seen_at"), int | float):
            fields.update(notice_source=seen.get("source"),
                          notice_to_checkpoint_s=round(done - float(seen["seen_at"]), 3),
                          seconds_left=round(float(seen.get("deadline", done)) - done, 1))
        self.events.emit(tm.KIND_WARNING, message=f"stopped: checkpoint of step {self.done_step} saved "
                         f"{fields['signal_to_checkpoint_s']:.1f}s after the signal", **fields)
        print(f"checkpoint of step {self.done_step} saved on stop in {fields['checkpoint_save_s']:.1f}s",
              flush=True)

    def train(self) -> None:
        from trainer.data import prompt_batches

        cfg = self.cfg
        first = self.done_step = self._resume()
        batches = prompt_batches(self.train_problems, prompts_per_process(cfg, self.topo.process_count),
                                 cfg.seed, cfg.data.shuffle, start_step=first)
        started = time.perf_counter()
        metrics: dict = {}
        try:
            for step in range(first + 1, cfg.steps + 1):
                if self.gate.agreed():
                    raise Terminated(self.gate.signum())
                try:
                    metrics = self._step(step, next(batches))
                    self.events.emit(tm.KIND_STEP, **metrics)
                    print(tm.human_step_line(metrics), flush=True)
                finally:
                    self.gate.release()  # a stop that came meanwhile is taken at the next step's start
                self.wandb.log(metrics, step)
                if cfg.eval_every_steps and (step % cfg.eval_every_steps == 0 or step == cfg.steps):
                    eval_metrics = self._eval(step)
                    self.events.emit(tm.KIND_EVAL, **eval_metrics)
                    print(f"eval step={step} accuracy={eval_metrics[tm.EVAL_ACCURACY]:.4f} "
                          f"reward_mean={eval_metrics[tm.EVAL_REWARD_MEAN]:.4f}", flush=True)
                    self.wandb.log(eval_metrics, step)
                if self.checkpointer is not None and self.checkpointer.should_save(step, cfg.steps):
                    with self.gate.deferred():
                        self.checkpointer.save(step, {"params": self.params, "opt_state": self.opt_state})
                if (fault := armed_step_fault(step, first)) is not None:  # tests only (fault_injection.py)
                    if self.checkpointer is not None:
                        self.checkpointer.close()  # the checkpoint of this step is written, then it fails
                    raise fault
            if self.checkpointer is not None:
                self.checkpointer.close()
        except Terminated:
            self._save_on_stop(first)
            self.wandb.finish(exit_code=1)
            raise
        except BaseException:
            self.wandb.finish(exit_code=1)
            raise
        summary = {k: metrics.get(k) for k in (tm.STEP_AVG_LAST10, tm.VALID_TOKENS_PER_S, tm.REWARD_MEAN,
                                               tm.MEM_PEAK)}
        self.events.emit(tm.KIND_END, status="ok", steps_done=cfg.steps - first, first_step=first + 1,
                         total_s=time.perf_counter() - started, **summary)
        self.wandb.finish(exit_code=0)


@jax.jit
def _assemble(t: dict) -> dict:
    """[prompt | completion] token rows, their attention mask, and the completion loss mask."""
    input_ids = jnp.concatenate([t["prompt_ids"], t["completion_ids"]], axis=1)
    attention_mask = jnp.concatenate([t["prompt_mask"], t["completion_mask"]], axis=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "completion_mask": t["completion_mask"].astype(jnp.float32)}

