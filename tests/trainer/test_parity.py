"""Reference parity: this Qwen2 against transformers' PyTorch Qwen2ForCausalLM on the same tiny checkpoint."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from trainer.rollout.sampler import Sampler

torch = pytest.importorskip("torch")  # test-only dependency, pinned to 2.13.0 by scripts/test
transformers = pytest.importorskip("transformers")


@pytest.fixture
def reference(tiny_model_dir):
    model = transformers.Qwen2ForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                          attn_implementation="eager")
    return model.eval()


def _padded_batch(vocab_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(3, vocab_size, (3, 14))
    mask = np.ones_like(ids)
    mask[0, :6] = 0  # left padding of different lengths
    mask[1, :1] = 0
    ids[mask == 0] = 0
    return ids, mask, np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def test_logits_match_transformers_fp32_on_a_padded_batch(tiny_model, reference):
    model, config = tiny_model
    ids, mask, positions = _padded_batch(config.vocab_size)
    ours = nnx.jit(lambda m, *a: m(*a))(model, jnp.asarray(ids), jnp.asarray(positions), jnp.asarray(mask))
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                           position_ids=torch.tensor(positions)).logits.numpy()
    valid = mask == 1
    assert np.abs(theirs[valid]).max() > 1.0  # logits are not trivially small
    np.testing.assert_allclose(np.asarray(ours)[valid], theirs[valid], atol=1e-4, rtol=0)


def test_greedy_decoding_matches_transformers_generate(tiny_model, reference):
    model, config = tiny_model
    prompts = [[11, 12, 13, 14, 15, 16, 17], [40, 41, 42], [90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100]]
    new_tokens = 24
    batch = Sampler(model, pad_id=0, eos_ids=config.eos_token_ids, buckets=(16,),
                    max_new_tokens=new_tokens).generate(prompts, rng=0, greedy=True)
    with torch.no_grad():
        out = reference.generate(input_ids=torch.tensor(np.asarray(batch.prompt_ids)),
                                 attention_mask=torch.tensor(np.asarray(batch.prompt_mask)),
                                 max_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                 eos_token_id=list(config.eos_token_ids))
    theirs = out[:, batch.prompt_ids.shape[1]:].numpy()
    # generate stops when every row has ended and pads ended rows with pad_token_id, as the Sampler does.
    theirs = np.pad(theirs, ((0, 0), (0, new_tokens - theirs.shape[1])), constant_values=0)
    np.testing.assert_array_equal(np.asarray(batch.completion_ids), theirs)
    assert len(np.unique(theirs)) > 3  # a real sequence, not one repeated token
