"""End tokens from generation_config.json (Qwen2.5's <|endoftext|> besides <|im_end|>), issue 16."""

from __future__ import annotations

import json

import pytest

from trainer.tokenizer import eos_token_ids, generation_eos_ids, load_tokenizer
from trainer.weights import load_model


def test_tiny_model_writes_a_qwen_like_generation_config(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert config == {"bos_token_id": endoftext, "eos_token_id": [im_end, endoftext],
                      "pad_token_id": endoftext}
    transformers = pytest.importorskip("transformers")
    assert transformers.GenerationConfig.from_pretrained(tiny_model_dir).eos_token_id == [im_end, endoftext]


def test_the_trainers_end_tokens_include_generation_configs(tiny_model_dir):
    # What the Trainer computes: eos_token_ids(tokenizer, model_config.eos_token_ids).
    tokenizer = load_tokenizer(tiny_model_dir)
    _, model_config = load_model(tiny_model_dir)
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert model_config.eos_token_ids == (im_end,)  # config.json names <|im_end|> only
    assert eos_token_ids(tokenizer, model_config.eos_token_ids) == tuple(sorted({im_end, endoftext}))
    assert generation_eos_ids(tiny_model_dir) == tuple(sorted({im_end, endoftext}))
    assert generation_eos_ids(str(tiny_model_dir)) == generation_eos_ids(tiny_model_dir)


@pytest.mark.parametrize("content, expected", [
    ({"eos_token_id": 151645}, (151645,)),
    ({"eos_token_id": [151645, 151643]}, (151643, 151645)),
    ({"eos_token_id": None}, ()),
    ({"do_sample": True}, ()),
])
def test_generation_eos_ids_reads_an_int_or_a_list(tmp_path, content, expected):
    (tmp_path / "generation_config.json").write_text(json.dumps(content))
    assert generation_eos_ids(tmp_path) == expected


def test_generation_eos_ids_without_a_file_or_path_is_empty_and_a_bad_file_is_named(tmp_path, tiny_model_dir):
    assert generation_eos_ids(tmp_path) == ()  # a directory without generation_config.json
    assert generation_eos_ids("") == () and generation_eos_ids(None) == ()
    assert generation_eos_ids(tmp_path / "missing") == ()  # a missing path fails where the model loads
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="generation_config.json is not a readable generation config"):
        generation_eos_ids(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": "<|im_end|>"}))
    with pytest.raises(ValueError, match="eos_token_id must be a token id or a list"):
        generation_eos_ids(tmp_path)
    # An explicit model_dir wins over the tokenizer's own directory.
    tokenizer = load_tokenizer(tiny_model_dir)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7]}))
    assert eos_token_ids(tokenizer, (), model_dir=tmp_path) == tuple(sorted({7, tokenizer.eos_token_id}))


def test_a_hub_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch):
    cached = tmp_path / "generation_config.json"
    cached.write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    calls = []

    def fake_cache(repo_id, filename):
        calls.append((repo_id, filename))
        return str(cached) if repo_id == "Qwen/Qwen2.5-0.5B-Instruct" else None

    monkeypatch.setattr("huggingface_hub.try_to_load_from_cache", fake_cache)
    assert generation_eos_ids("Qwen/Qwen2.5-0.5B-Instruct") == (151643, 151645)
    assert generation_eos_ids("Qwen/not-downloaded") == ()
    assert calls == [("Qwen/Qwen2.5-0.5B-Instruct", "generation_config.json"),
                     ("Qwen/not-downloaded", "generation_config.json")]
