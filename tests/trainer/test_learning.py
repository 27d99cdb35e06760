"""GRPO learns: with the real sampler, model and update step, a tiny model rewarded for emitting one token
learns to emit it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trainer.data import left_pad
from trainer.grpo import (
    GRPOStep,
    LossSettings,
    group_advantages,
    make_optimizer,
    make_schedule,
    positions_from_mask,
)
from trainer.programs import completion_token_stats_fn
from trainer.rollout.sampler import Sampler
from trainer.synthetic_gsm8k import generate_problems
from trainer.tokenizer import encode_chat_prompts, eos_token_ids, load_tokenizer
from trainer.weights import load_model

# The 4 prompts are 57-66 tokens long: left-padded to 72 (padding is masked, so the width changes nothing but
# the work per step).
PROMPT_LEN, NEW_TOKENS, GROUP, PROMPTS, STEPS = 72, 8, 8, 4, 24


def test_mean_reward_rises_on_a_toy_token_reward(tiny_model_dir):
    model, config = load_model(tiny_model_dir, compute_dtype=jnp.float32)
    tokenizer = load_tokenizer(tiny_model_dir)
    sampler = Sampler(model, tokenizer.pad_token_id, eos_token_ids(tokenizer, config.eos_token_ids),
                      buckets=(PROMPT_LEN,), max_new_tokens=NEW_TOKENS)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    optimizer = make_optimizer("adamw", make_schedule(3e-3, "constant", STEPS, 0, 0.1), clip_norm=1.0,
                               weight_decay=0.0, b1=0.9, b2=0.999)
    # Committed to the device as the update's outputs are, so step 2 reuses step 1's compilation.
    opt_state = jax.device_put(optimizer.init(params), jax.devices()[0])
    step = GRPOStep(
        completion_token_stats_fn(graphdef, PROMPT_LEN, chunk=0),
        optimizer,
        prompt_len=PROMPT_LEN,
        temperature=1.0,
        micro_batches=2,
        loss=LossSettings(),
    )
    questions = [p["question"] for p in generate_problems(PROMPTS, seed=0)]
    prompts = [ids for ids in encode_chat_prompts(tokenizer, questions) for _ in range(GROUP)]
    assert max(len(p) for p in prompts) <= PROMPT_LEN  # nothing truncated

    # The target: the token the untrained model finds likeliest after the prompt (about 1%: its logits are
    # nearly flat), so a rollout of 256 tokens meets it a few times and GRPO has something to reinforce.
    ids, mask = left_pad(prompts[::GROUP], PROMPT_LEN, tokenizer.pad_token_id)
    logits = model(jnp.asarray(ids), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask))[:, -1]
    target = int(jnp.argmax(jax.nn.softmax(logits, axis=-1).mean(axis=0)))

    history = []
    for i in range(STEPS):
        rollout = sampler.generate(prompts, i + 1, state=nnx.merge_state(params, rest))
        ids = np.asarray(rollout.completion_ids)
        mask = np.asarray(rollout.completion_mask).astype(np.float32)
        reward = ((ids == target) * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1)
        batch = {
            "input_ids": jnp.concatenate([rollout.prompt_ids, rollout.completion_ids], axis=1),
            "attention_mask": jnp.concatenate([rollout.prompt_mask, rollout.completion_mask], axis=1),
            "completion_mask": jnp.asarray(mask),
            "advantages": jnp.asarray(group_advantages(reward.astype(np.float32), GROUP)),
        }
        params, opt_state, _ = step.update(params, rest, opt_state, batch)
        history.append(float(reward.mean()))
    early, late = np.mean(history[:5]), np.mean(history[-5:])
    assert early < 0.1, history
    print("mean reward per step:", [round(r, 3) for r in history])
    assert late > 0.3 and late > early + 0.25, history
