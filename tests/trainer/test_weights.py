"""HF checkpoint load/save, the tiny model directory, the tokenizer and the make-tiny-model command."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from trainer import weights
from trainer.__main__ import main as trainer_main
from trainer.tokenizer import encode_chat_prompts, eos_token_ids, load_tokenizer
from trainer.weights import hf_key_map, load_model, save_model


def _params(model) -> dict[str, np.ndarray]:
    return {name: np.asarray(weights._variable(model, path)[...]) for name, path, _ in
            hf_key_map(model.config)}


def test_tiny_dir_is_a_small_hf_qwen2_checkpoint(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["architectures"] == ["Qwen2ForCausalLM"]
    tensors = load_file(tiny_model_dir / "model.safetensors")
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (64, 64)  # HF [out, in]
    assert tensors["model.layers.1.self_attn.k_proj.bias"].shape == (32,)
    assert "lm_head.weight" not in tensors  # tied embeddings
    size = sum(f.stat().st_size for f in tiny_model_dir.iterdir())
    assert size < 8 * 1024 * 1024


def test_loaded_params_equal_checkpoint_with_transposes(tiny_model_dir, tiny_model):
    model, config = tiny_model
    tensors = load_file(tiny_model_dir / "model.safetensors")
    params = _params(model)
    for name, _, transpose in hf_key_map(config):
        expected = tensors[name].T if transpose else tensors[name]
        np.testing.assert_array_equal(params[name], expected, err_msg=name)
    # Biases and norms are not the trivial zeros/ones, so a mapping mix-up would show.
    assert np.abs(params["model.layers.0.self_attn.v_proj.bias"]).max() > 0.01


def test_save_load_round_trip_single_and_sharded(tmp_path, tiny_model):
    model, config = tiny_model
    single = save_model(model, config, tmp_path / "single")
    sharded = save_model(model, config, tmp_path / "sharded", max_shard_bytes=100_000)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1 and all((sharded / f).is_file() for f in files)
    for directory in (single, sharded):
        reloaded, reloaded_config = load_model(directory, compute_dtype=jnp.float32)
        assert reloaded_config == config
        for name, value in _params(reloaded).items():
            np.testing.assert_array_equal(value, _params(model)[name], err_msg=name)


def test_bf16_storage_and_param_dtype(tmp_path, tiny_model):
    model, config = tiny_model
    out = save_model(model, config, tmp_path / "bf16", dtype=jnp.bfloat16)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    reloaded, _ = load_model(out, param_dtype=jnp.bfloat16)
    assert reloaded.embed_tokens[...].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(reloaded.embed_tokens[...], np.float32),
                               np.asarray(model.embed_tokens[...]), rtol=1e-2, atol=1e-2)


def test_missing_tensor_and_wrong_shape_are_named(tmp_path, tiny_model_dir):
    tensors = load_file(tiny_model_dir / "model.safetensors")
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"}, tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="model.norm.weight"):
        load_model(tmp_path)
    tensors["model.norm.weight"] = np.ones(5, np.float32)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.norm.weight: shape \(5,\)"):
        load_model(tmp_path)


def test_hub_ids_go_to_the_hub_and_bad_paths_are_explained(monkeypatch, tmp_path, tiny_model_dir):
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append(repo_id)
        return str(tiny_model_dir)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    _, config = load_model("Qwen/Qwen2.5-0.5B-Instruct")
    assert calls == ["Qwen/Qwen2.5-0.5B-Instruct"] and config.hidden_size == 64
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_model(tmp_path / "nope")


def test_tokenizer_chat_template_and_round_trip(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert tokenizer.padding_side == "left"
    [ids] = encode_chat_prompts(tokenizer, ["Ava has $12. How many apples are left?"])
    text = tokenizer.decode(ids)
    assert text == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                    "Ava has $12. How many apples are left?<|im_end|>\n<|im_start|>assistant\n")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    answer = "She has 12 - 5 = <<12-5=7>>7 left.\n#### 7"
    assert tokenizer.decode(tokenizer.encode(answer, add_special_tokens=False)) == answer
    # <|im_end|> (the tokenizer's eos and the model config's) plus generation_config.json's <|endoftext|>.
    assert eos_token_ids(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")]) == tuple(sorted(
        {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}))


def test_make_tiny_model_command(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert trainer_main(["make-tiny-model", str(out), "--num-hidden-layers", "1", "--vocab-size", "600"]) == 0
    assert "wrote tiny Qwen2 model" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["vocab_size"] == 600
    assert (out / "tokenizer.json").is_file()


def test_scanned_model_loads_every_layer_stacked_and_saves_them_per_layer(tmp_path, tiny_model_dir,
                                                                         tiny_model):
    # train.scan_layers: each block weight is one [layers, ...] array read from the per-layer HF tensors, and
    # save_model writes them back as the per-layer tensors transformers reads.
    unrolled, config = tiny_model
    scanned, _ = load_model(tiny_model_dir, compute_dtype=jnp.float32, scan_layers=True)
    tensors = load_file(tiny_model_dir / "model.safetensors")
    gate = scanned.layers[0].mlp.gate_proj.kernel[...]
    assert len(scanned.layers) == 1 and gate.shape == (config.num_hidden_layers, 64, 128)
    for i in range(config.num_hidden_layers):
        np.testing.assert_array_equal(np.asarray(gate[i]),
                                      tensors[f"model.layers.{i}.mlp.gate_proj.weight"].T)
        np.testing.assert_array_equal(np.asarray(scanned.layers[0].self_attn.k_proj.bias[...][i]),
                                      tensors[f"model.layers.{i}.self_attn.k_proj.bias"])
    saved = save_model(scanned, config, tmp_path / "from-scanned")
    for name, value in load_file(saved / "model.safetensors").items():
        np.testing.assert_array_equal(value, tensors[name], err_msg=name)
