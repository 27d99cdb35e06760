"""Less work per token in the rollout, same tokens: a cache that grows in length buckets, one prefill
per distinct prompt, a cache without the prompt slots that are padding in every row."""

from __future__ import annotations

import numpy as np

from trainer.mesh import make_mesh
from trainer.rollout.sampler import Sampler
from trainer.rollout.sharded import ShardedSampler

# Three distinct prompts, each repeated for its samples (a GRPO group's rows are adjacent), one out of order.
DISTINCT = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20]]
GROUPED = [p for p in DISTINCT for _ in range(3)] + [DISTINCT[1]]


class _EveryRow(Sampler):
    """The sampler as before: every row prefilled (one decode segment with attend_bucket=0)."""

    def shared_prompts(self, ids: np.ndarray) -> None:
        return None


def _pair(tiny_model, eos_ids=None, **kwargs) -> tuple[Sampler, Sampler]:
    model, config = tiny_model
    options = {"buckets": (16,), "max_new_tokens": 12} | kwargs
    eos = config.eos_token_ids if eos_ids is None else eos_ids
    return (Sampler(model, 0, eos, attend_bucket=4, **options),
            _EveryRow(model, 0, eos, attend_bucket=0, **options))


def test_shared_prompts_maps_each_row_to_its_prompt(tiny_model):
    sampler, _ = _pair(tiny_model)
    ids, _ = sampler.pad_prompts(GROUPED)
    distinct, rows = sampler.shared_prompts(ids)
    assert distinct.tolist() == [0, 3, 6]  # first appearances, in order
    np.testing.assert_array_equal(ids[distinct][rows], ids)
    assert sampler.shared_prompts(ids[distinct]) is None  # nothing repeats: every row prefilled
    assert sampler.segments == (4, 8, 12)  # new tokens the cache holds in each decode segment


def test_buckets_and_shared_prefill_give_the_same_tokens(tiny_model):
    # End tokens that a sampled row meets now and then (5% of the vocabulary): rows end inside a bucket.
    now, before = _pair(tiny_model, eos_ids=range(100, 150))
    for kwargs in ({"greedy": True}, {"temperature": 1.0}):
        mine, theirs = now.generate(GROUPED, rng=4, **kwargs), before.generate(GROUPED, rng=4, **kwargs)
        np.testing.assert_array_equal(mine.completion_ids, theirs.completion_ids)
        np.testing.assert_array_equal(mine.completion_mask, theirs.completion_mask)
        np.testing.assert_array_equal(mine.prompt_ids, theirs.prompt_ids)
        np.testing.assert_allclose(mine.logprobs, theirs.logprobs, atol=1e-5)
    lengths = np.asarray(mine.completion_mask).sum(axis=1)
    assert lengths.min() < 12 and len({tuple(r) for r in np.asarray(mine.completion_ids)}) > 3, lengths


def test_sharded_cache_skips_prompt_padding(tiny_model):
    # Prompts padded to a fixed 128 come back at that width; the cache holds the last 64 slots only.
    model, config = tiny_model
    mesh = make_mesh("1,1,1")
    options = {"prompt_len": 128, "max_new_tokens": 8, "mesh": mesh}
    now = ShardedSampler(model, 0, config.eos_token_ids, attend_bucket=4, **options)
    whole = ShardedSampler(model, 0, config.eos_token_ids, attend_bucket=0, **options)
    whole.cache_prompt_width = lambda padded, longest: padded
    assert now.cache_prompt_width(128, 9) == 64 and now.cache_prompt_width(128, 100) == 128
    mine, theirs = now.generate(GROUPED, rng=0, greedy=True), whole.generate(GROUPED, rng=0, greedy=True)
    assert mine.prompt_ids.shape == (len(GROUPED), 128)
    np.testing.assert_array_equal(mine.prompt_ids, theirs.prompt_ids)
    np.testing.assert_array_equal(mine.completion_ids, theirs.completion_ids)
    np.testing.assert_allclose(mine.logprobs, theirs.logprobs, atol=1e-5)
