"""A config's `~/...` model path means the worker's home: both the weights and the tokenizer must
follow it."""

import shutil

from trainer.tokenizer import load_tokenizer
from trainer.weights import resolve_model_dir


def test_home_relative_model_path_loads_tokenizer_and_weights(tiny_model_dir, tmp_path, monkeypatch):
    home = tmp_path / "home"
    shutil.copytree(tiny_model_dir, home / "tiny-qwen2")
    monkeypatch.setenv("HOME", str(home))

    assert resolve_model_dir("~/tiny-qwen2") == home / "tiny-qwen2"
    tokenizer = load_tokenizer("~/tiny-qwen2")
    assert tokenizer.padding_side == "left"
    assert tokenizer.chat_template
