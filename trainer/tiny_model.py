"""`python -m trainer make-tiny-model DIR`: a few-MB HF-format Qwen2 directory that needs no download.

Random weights, a byte-level BPE tokenizer trained with `tokenizers` on the project's synthetic GSM8K text,
and a Qwen-style chat template. It is read back through exactly the path a real checkpoint takes
(`load_model`, `load_tokenizer`), so everything downstream runs offline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trainer.model import Qwen2Config, create_model
from trainer.synthetic_gsm8k import generate_problems
from trainer.weights import save_model

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"

# Qwen2.5's template, without tool calls: default system prompt, <|im_start|>role\n...<|im_end|>\n turns.
CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclasses.dataclass(frozen=True)
class TinySpec:
    vocab_size: int = 1024
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    seed: int = 0


def _corpus(n_problems: int, seed: int) -> list[str]:
    texts = []
    for p in generate_problems(n_problems, seed):
        texts.append(f"{IM_START}user\n{p['question']}{IM_END}\n{IM_START}assistant\n{p['answer']}{IM_END}\n")
    return texts


def train_tokenizer(vocab_size: int, seed: int = 0, n_problems: int = 2000) -> Tokenizer:
    """Byte-level BPE (Qwen's family of tokenizer) over synthetic GSM8K text, with Qwen's special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[ENDOFTEXT, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_corpus(n_problems, seed), trainer=trainer)
    return tokenizer


def _perturb(model, seed: int) -> None:
    """Give biases and norm scales random values so a key-mapping mistake cannot hide behind zeros/ones."""
    key = jax.random.key(seed + 1)
    for path, var in nnx.iter_graph(model):
        if isinstance(var, nnx.Param) and path[-1] in ("bias", "scale"):
            key, sub = jax.random.split(key)
            noise = 0.1 * jax.random.normal(sub, var.shape, jnp.float32)
            var.set_value((var[...] + noise).astype(var.dtype))


def make_tiny_model(out_dir: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """Write config.json, generation_config.json, model.safetensors, the tokenizer files and the chat template
    into out_dir."""
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    bpe = train_tokenizer(spec.vocab_size, spec.seed)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=IM_END, pad_token=ENDOFTEXT,
                                        additional_special_tokens=[IM_START])
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    config = Qwen2Config(
        vocab_size=max(spec.vocab_size, len(tokenizer)), hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=4096, initializer_range=0.1,  # wider than 0.02: peaked, non-uniform logits
        bos_token_id=bpe.token_to_id(ENDOFTEXT), eos_token_id=bpe.token_to_id(IM_END),
        pad_token_id=bpe.token_to_id(ENDOFTEXT), tie_word_embeddings=True)
    model = create_model(config, seed=spec.seed, compute_dtype=jnp.float32)
    _perturb(model, spec.seed)
    save_model(model, config, out)
    write_generation_config(out, bos=bpe.token_to_id(ENDOFTEXT), eos=[bpe.token_to_id(IM_END),
                                                                      bpe.token_to_id(ENDOFTEXT)],
                            pad=bpe.token_to_id(ENDOFTEXT))
    return out


def write_generation_config(out: Path, *, bos: int, eos: list[int], pad: int) -> None:
    """generation_config.json with the token ids of Qwen2.5-Instruct's: generation ends at <|im_end|> or
    <|endoftext|>, which config.json's single eos_token_id does not say. Qwen's sampling defaults
    (temperature, top_p, top_k, repetition_penalty) are left out: transformers' `generate` would apply them
    to every comparison that loads this directory, while the trainer samples as its config says."""
    config = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}
    (out / "generation_config.json").write_text(json.dumps(config, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    defaults = TinySpec()
    parser = argparse.ArgumentParser(prog="python -m trainer make-tiny-model",
                                     description="Write a tiny random Qwen2 model directory (HF format).")
    parser.add_argument("dir", help="output directory")
    for field in dataclasses.fields(TinySpec):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=int, default=getattr(defaults, field.name))
    args = parser.parse_args(argv)
    spec = TinySpec(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TinySpec)})
    out = make_tiny_model(args.dir, spec)
    print(f"wrote tiny Qwen2 model to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
