"""Tokenizer and chat template, loaded with transformers from the model directory (or hub id)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(path_or_hub_id: str | os.PathLike) -> PreTrainedTokenizerBase:
    """`AutoTokenizer` from an HF directory or hub id; left padding, so prompts end where decode starts."""
    local = Path(path_or_hub_id).expanduser()  # "~/tiny-qwen2" in a config means this host's home
    tokenizer = AutoTokenizer.from_pretrained(str(local) if local.is_dir() else str(path_or_hub_id))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ValueError(f"the tokenizer at {path_or_hub_id} has no chat template; use an *-Instruct "
                         "checkpoint or a directory written by `python -m trainer make-tiny-model`")
    return tokenizer


def chat_prompt(tokenizer: PreTrainedTokenizerBase, user: str, system: str | None = None) -> str:
    """The chat-template text of one user turn, ending with the assistant's generation prompt."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_chat_prompts(tokenizer: PreTrainedTokenizerBase, users: Sequence[str],
                        system: str | None = None) -> list[list[int]]:
    """Token ids of each user turn wrapped in the chat template (the template already adds special tokens)."""
    texts = [chat_prompt(tokenizer, user, system) for user in users]
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, config_eos: Sequence[int] = ()) -> tuple[int, ...]:
    """Token ids that end a completion: the tokenizer's eos plus the model config's (e.g. <|im_end|>)."""
    ids = {int(i) for i in config_eos}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))
