# Tunix's PeftTrainer (full-parameter SFT) on CPU: its Llama 3 model at a tiny size made on the spot, random
# weights, synthetic token batches; 20 steps with an eval every 10. Run: python train.py
# Tunix's tqdm bar shows only on a terminal; its per-step lines are absl INFO logs, which app.run prints.
import jax
import numpy as np
import optax
from absl import app
from flax import nnx
from tunix import PeftTrainer, TrainingConfig
from tunix.models.llama3 import model as llama3
from tunix.sft import utils as sft_utils

STEPS, EVAL_EVERY, BATCH, SEQ, VOCAB = 20, 10, 4, 32, 256


def batches(count, seed):
    """Sequences that count up from a random token: learnable, so the loss falls."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        starts = rng.integers(1, VOCAB, size=(BATCH, 1))
        tokens = ((starts + np.arange(SEQ)) % (VOCAB - 1) + 1).astype(np.int32)
        yield {"input_tokens": tokens, "input_mask": np.ones((BATCH, SEQ), dtype=bool)}


def model_input(batch):
    mask = batch["input_mask"]
    return {
        "input_tokens": batch["input_tokens"],
        "input_mask": mask,
        "positions": sft_utils.build_positions_from_mask(mask),
        "attention_mask": sft_utils.make_causal_attn_mask(mask),
    }


def main(argv):
    del argv
    config = llama3.ModelConfig(num_layers=2, vocab_size=VOCAB, embed_dim=64, hidden_dim=128, num_heads=4,
                                head_dim=16, num_kv_heads=2, rope_theta=500_000, norm_eps=1e-5)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    with mesh:
        model = llama3.Llama3(config, rngs=nnx.Rngs(params=0))
        trainer = PeftTrainer(model, optax.adamw(3e-3),
                              TrainingConfig(eval_every_n_steps=EVAL_EVERY, max_steps=STEPS))
        trainer = trainer.with_gen_model_input_fn(model_input)
        trainer.train(list(batches(STEPS, seed=0)), list(batches(2, seed=1)))


if __name__ == "__main__":
    app.run(main)
