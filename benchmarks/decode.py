"""Rollout decode speed: trainer.rollout.sampler.Sampler vs transformers' `generate`, same weights, same run.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/decode.py [--batch 32] [--new-tokens 64] [--repeats 5]
        [--dtype bfloat16|float32] [--temperature 1.0] [--top-k 0] [--top-p 1.0]

A tiny-but-not-trivial Qwen2 (4 layers, hidden 256, vocab 8192) is written with make-tiny-model into a temp
directory, loaded by both sides from that directory, and asked for `batch` prompts x `new-tokens` sampled
tokens. The defaults are what a GRPO rollout of the trainer does: the model's default compute dtype (bf16,
fp32 params) and the rollout config's default sampling (temperature 1.0, no top-k, no top-p); both sides get
the same dtype and sampling settings. Prompts are the bare questions (about 30-50 tokens, bucket 64), so
decode dominates as it does in GRPO. End tokens are disabled so both sides decode exactly batch x new-tokens
tokens. Prints tokens/s for each (median of alternating repeats, after a warm-up), the ratio, and the
Sampler's one-off compile time separately. Target: ratio >= 3 on CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import Qwen2ForCausalLM as TorchQwen2

from trainer.config import RolloutConfig
from trainer.rollout.sampler import Sampler
from trainer.synthetic_gsm8k import generate_problems
from trainer.tiny_model import TinySpec, make_tiny_model
from trainer.tokenizer import load_tokenizer
from trainer.weights import load_model

SPEC = TinySpec(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2)
DTYPES = {"float32": (jnp.float32, torch.float32), "bfloat16": (jnp.bfloat16, torch.bfloat16)}


def _seconds(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                        help="compute dtype of both sides (weights are stored fp32 and cast); the trainer's "
                             "default is bfloat16")
    rollout = RolloutConfig()
    parser.add_argument("--temperature", type=float, default=rollout.temperature)
    parser.add_argument("--top-k", type=int, default=rollout.top_k, help="0: no top-k filtering")
    parser.add_argument("--top-p", type=float, default=rollout.top_p)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    jax_dtype, torch_dtype = DTYPES[args.dtype]

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(tmp, SPEC)
        tokenizer = load_tokenizer(model_dir)
        questions = [p["question"] for p in generate_problems(args.batch, seed=0)]
        prompts = [tokenizer.encode(q, add_special_tokens=False) for q in questions]
        never = SPEC.vocab_size + 1  # an id no model output can take: every row decodes all new tokens

        model, config = load_model(model_dir, compute_dtype=jax_dtype)
        sampler = Sampler(model, pad_id=tokenizer.pad_token_id, eos_ids=[never], buckets=(64, 128, 256),
                          max_new_tokens=args.new_tokens)

        def ours(seed: int = 0):
            batch = sampler.generate(prompts, rng=seed, temperature=args.temperature, top_k=args.top_k,
                                     top_p=args.top_p)
            jax.block_until_ready(batch.completion_ids)
            return batch

        start = time.perf_counter()
        first = ours()
        first_call_s = time.perf_counter() - start
        assert int(first.completion_mask.sum()) == args.batch * args.new_tokens

        reference = TorchQwen2.from_pretrained(model_dir, dtype=torch_dtype).eval()
        input_ids = torch.tensor(np.asarray(first.prompt_ids))
        attention_mask = torch.tensor(np.asarray(first.prompt_mask))

        @torch.inference_mode()
        def theirs():
            out = reference.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True,
                                     temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                     max_new_tokens=args.new_tokens, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=never)
            assert out.shape[1] - input_ids.shape[1] == args.new_tokens
            return out

        theirs()  # warm-up
        # Alternate the two so that both see the same machine load; report medians.
        ours_times, theirs_times = [], []
        for _ in range(args.repeats):
            ours_times.append(_seconds(ours))
            theirs_times.append(_seconds(theirs))
        ours_s, theirs_s = statistics.median(ours_times), statistics.median(theirs_times)
        compile_s = first_call_s - ours_s

    tokens = args.batch * args.new_tokens
    ours_tps, theirs_tps = tokens / ours_s, tokens / theirs_s
    print(f"model: {SPEC.num_hidden_layers} layers, hidden {SPEC.hidden_size}, vocab {config.vocab_size}; "
          f"batch {args.batch}, prompt bucket {first.prompt_ids.shape[1]}, {args.new_tokens} new tokens, "
          f"sampling T={args.temperature} top-k={args.top_k} top-p={args.top_p}, {args.dtype} on both sides, "
          f"{os.cpu_count()} CPU threads, "
          f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}")
    print(f"trainer Sampler:        {ours_tps:10.1f} tokens/s  ({ours_s * 1000:.0f} ms per batch)")
    print(f"transformers generate:  {theirs_tps:10.1f} tokens/s  ({theirs_s * 1000:.0f} ms per batch)")
    print(f"ratio (Sampler / transformers): {ours_tps / theirs_tps:.2f}x   (target >= 3x); per repeat: "
          + ", ".join(f"{t / o:.2f}x" for o, t in zip(ours_times, theirs_times, strict=True)))
    print(f"Sampler compile time (first call minus a warm call): {compile_s:.2f} s, "
          f"compilations: {sampler.compile_count}")


if __name__ == "__main__":
    main()
