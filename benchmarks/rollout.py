"""A GRPO-shaped rollout on CPU: today's decode loop against the one before length buckets and shared
prefill, same model, same prompts, same keys, same run.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/rollout.py [--prompts 16] [--samples 8]
        [--max-new-tokens 1024] [--mean-length 200] [--repeats 3] [--greedy-tokens 256]

The tiny model of `python -m trainer make-tiny-model`, 16 synthetic GSM8K problems (the generator behind
`make-gsm8k-jsonl`) in the trainer's chat format with its system prompt, each repeated for its 8 samples as
the trainer does, through the trainer's own sampler (ShardedSampler on a one-device mesh, prompt length
rollout.global_length, sampling temperature 1, max new tokens 1024: the rollout config's defaults).

Answers end at realistic lengths: the untrained tiny model draws nearly uniformly from its vocabulary, so a
set of end tokens holding 1/mean-length of the vocabulary ends each row after a geometric number of tokens
(mean about 200, most rows a few hundred tokens, the longest of 128 several times that), with the fixed
sampling key of every repeat, while max new tokens stays at 1024. The lengths are printed.

Both paths run the same sampled rollout (same key: the same tokens are expected) and a greedy rollout of
`--greedy-tokens` new tokens without end tokens (the same tokens required). `before` (BeforeSampler) is
the same sampler as it was: attention over every `prompt length + max new tokens` slot every step, the
cache holding the whole fixed prompt length, and 128 prefills of 16 distinct prompts. Prints seconds per
rollout (median of alternating repeats after a warm-up), the ratio, and whether the tokens are identical.
Target: >= 1.5x.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from trainer.config import RolloutConfig
from trainer.data import SYSTEM_PROMPT
from trainer.mesh import make_mesh
from trainer.rollout.sharded import ShardedSampler
from trainer.synthetic_gsm8k import generate_problems
from trainer.tiny_model import make_tiny_model
from trainer.tokenizer import encode_chat_prompts, load_tokenizer
from trainer.weights import load_model


class BeforeSampler(ShardedSampler):
    """The rollout before length buckets and shared prefill: attention over every `prompt_len + max new
    tokens` slot every step, every row prefilled, the cache holding the whole fixed prompt length."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, attend_bucket=0, **kwargs)

    def shared_prompts(self, ids: np.ndarray) -> None:
        return None

    def cache_prompt_width(self, padded_width: int, longest_prompt: int) -> int:
        return padded_width


def _end_tokens(vocab: int, mean_length: int, avoid: set[int]) -> list[int]:
    """vocab / mean_length token ids spread over the vocabulary (none of `avoid`): the end tokens."""
    count = max(1, round(vocab / mean_length))
    candidates = [i for i in range(vocab) if i not in avoid]
    step = len(candidates) // count
    return [candidates[i * step + step // 2] for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    rollout = RolloutConfig()
    parser.add_argument("--prompts", type=int, default=rollout.batch_size)
    parser.add_argument("--samples", type=int, default=rollout.n)
    parser.add_argument("--prompt-length", type=int, default=rollout.global_length,
                        help="the prompt bucket (rollout.global_length)")
    parser.add_argument("--max-new-tokens", type=int, default=rollout.max_length_sample)
    parser.add_argument("--mean-length", type=int, default=200, help="mean answer length in tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--greedy-tokens", type=int, default=256,
                        help="new tokens of the greedy comparison (no end tokens: every row runs to it)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(tmp)
        tokenizer = load_tokenizer(model_dir)
        questions = [p["question"] for p in generate_problems(args.prompts, seed=0)]
        distinct = encode_chat_prompts(tokenizer, questions, system=SYSTEM_PROMPT)
        prompts = [p for p in distinct for _ in range(args.samples)]  # a prompt's samples adjacent
        model, config = load_model(model_dir)
    mesh = make_mesh("1,1,1", jax.devices()[:1])
    ends = _end_tokens(config.vocab_size, args.mean_length, {tokenizer.pad_token_id})

    def sampler(kind: type[ShardedSampler], eos: list[int], new_tokens: int) -> ShardedSampler:
        return kind(model, tokenizer.pad_token_id, eos, prompt_len=args.prompt_length,
                    max_new_tokens=new_tokens, mesh=mesh)

    paths = {"before": BeforeSampler, "now": ShardedSampler}
    sampled = {name: sampler(kind, ends, args.max_new_tokens) for name, kind in paths.items()}

    def run(name: str, greedy: bool = False, target: dict | None = None) -> object:
        batch = (target or sampled)[name].generate(prompts, rng=0, temperature=rollout.temperature,
                                                   greedy=greedy)
        jax.block_until_ready(batch.completion_ids)
        return batch

    out = {name: run(name) for name in paths}  # warm-up (compiles)
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeats):  # alternating, so both see the same machine load
        for name in paths:
            start = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(t) for name, t in times.items()}

    never = config.vocab_size + 1  # no row ends: every row decodes greedy-tokens tokens
    greedy = {name: sampler(kind, [never], args.greedy_tokens) for name, kind in paths.items()}
    greedy_out = {name: run(name, greedy=True, target=greedy) for name in paths}

    def same(a, b) -> bool:
        return bool(np.array_equal(np.asarray(a.completion_ids), np.asarray(b.completion_ids)))

    lengths = np.asarray(out["now"].completion_mask).sum(axis=1)
    logprob_gap = float(np.max(np.abs(np.asarray(out["now"].logprobs) - np.asarray(out["before"].logprobs))))
    print(f"model: tiny ({config.num_hidden_layers} layers, hidden {config.hidden_size}, vocab "
          f"{config.vocab_size}); {args.prompts} prompts x {args.samples} samples, prompt tokens "
          f"{min(map(len, distinct))}-{max(map(len, distinct))} in a {args.prompt_length} bucket, max new "
          f"tokens {args.max_new_tokens}, temperature {rollout.temperature}, {len(ends)} end tokens; "
          f"{os.cpu_count()} CPU threads, jax {jax.__version__} on {jax.devices()[0].platform}")
    print(f"answer lengths: median {int(np.median(lengths))}, p90 {int(np.percentile(lengths, 90))}, "
          f"longest {int(lengths.max())} (the loop's steps), shortest {int(lengths.min())}")
    width = sampled["now"].cache_prompt_width(args.prompt_length, max(map(len, distinct)))
    print(f"now: the cache holds {width} prompt slots (before: {args.prompt_length}) and, segment by "
          f"segment, {sampled['now'].segments} new tokens (before: {args.max_new_tokens}); {args.prompts} "
          f"prefills (before: {len(prompts)})")
    for name in paths:
        print(f"{name:>6}: {seconds[name]:7.2f} s per rollout  (repeats: "
              + ", ".join(f"{t:.2f}" for t in times[name]) + ")")
    print(f"ratio (before / now): {seconds['before'] / seconds['now']:.2f}x   (target >= 1.5x)")
    print(f"sampled tokens identical: {same(out['now'], out['before'])} (largest log-prob difference "
          f"{logprob_gap:.2e}); greedy tokens identical ({args.greedy_tokens} new tokens): "
          f"{same(greedy_out['now'], greedy_out['before'])}")


if __name__ == "__main__":
    main()
