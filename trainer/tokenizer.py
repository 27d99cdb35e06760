"""Tokenizer and chat template, loaded with transformers from the model directory (or hub id)."""

from __future__ import annotations

import json
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


def eos_token_ids(tokenizer: PreTrainedTokenizerBase, config_eos: Sequence[int] = (),
                  model_dir: str | os.PathLike | None = None) -> tuple[int, ...]:
    """Token ids that end a completion: the tokenizer's eos, the model config's (e.g. <|im_end|>) and those of
    the model's generation_config.json (Qwen2.5 adds <|endoftext|>). The model directory defaults to the one
    the tokenizer was loaded from (`load_tokenizer` / `from_pretrained` record it as `name_or_path`)."""
    ids = {int(i) for i in config_eos}
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    ids.update(generation_eos_ids(tokenizer.name_or_path if model_dir is None else model_dir))
    return tuple(sorted(ids))


def generation_eos_ids(path_or_hub_id: str | os.PathLike | None) -> tuple[int, ...]:
    """`eos_token_id` (an int or a list) of the model's generation_config.json; () when there is none.

    A directory is read as is; a hub id only from the local Hugging Face cache (where `load_model` put the
    checkpoint's json files), never over the network."""
    file = _generation_config_file(path_or_hub_id)
    if file is None:
        return ()
    try:
        value = json.loads(file.read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{file} is not a readable generation config ({exc}); fix or delete it") from None
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"{file}: eos_token_id must be a token id or a list of them, got {value!r}")
    return tuple(sorted(set(values)))


def _generation_config_file(path_or_hub_id: str | os.PathLike | None) -> Path | None:
    if not path_or_hub_id or not str(path_or_hub_id).strip():
        return None
    local = Path(path_or_hub_id).expanduser()
    if local.is_dir():
        file = local / "generation_config.json"
        return file if file.is_file() else None
    text = str(path_or_hub_id)
    if local.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        return None  # not a hub id (a missing local path fails where the model is loaded)
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(text, "generation_config.json")
    except ValueError:  # not a valid repo id
        return None
    return Path(cached) if isinstance(cached, str) else None
