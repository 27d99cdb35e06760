"""Trainer config: defaults, --set typing, at least ten kinds of rejected config, topology checks, the CLI's
--print-config and error path, and every shipped config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainer import cli
from trainer.config import ConfigError, check_environment, check_topology, load_config

BASE = {"model_path": "Qwen/Qwen2.5-3B-Instruct", "steps": 3}
CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def test_defaults_and_typed_overrides():
    cfg = load_config(raw=dict(BASE), overrides=[
        "rollout.n=4", "train.learning_rate=1e-5", "rollout.temperature=0.7", "train.optimizer=lion",
        "reward_weights={correct: 2.0}", "wandb_name=run-a", "checkpoint.dir=null", "mesh_shape= 2, -1 ,1"])
    assert cfg.rollout.n == 4 and cfg.train.learning_rate == 1e-5  # YAML reads 1e-5 as a string: coerced
    assert cfg.rollout.temperature == 0.7 and cfg.train.optimizer == "lion"
    assert cfg.reward_weights == {"correct": 2.0} and cfg.wandb_name == "run-a"
    assert cfg.mesh_shape == "2,-1,1"
    assert cfg.rollout.batch_size == 16 and cfg.train.ppo_epochs == 1 and cfg.wandb_mode == "disabled"
    assert cfg.digest() == load_config(raw=cfg.model_dump()).digest()
    assert cfg.digest() != load_config(raw=dict(BASE)).digest()


# (raw config or overrides, words the one-line message must contain)
BAD = [
    ({"stepz": 3}, ["stepz", "unknown key", "did you mean 'steps'"]),
    ({"rollout": {"nn": 8}}, ["rollout.nn", "unknown key", "batch_size"]),
    ({"steps": "many"}, ["steps", "valid integer"]),
    ({"steps": 0}, ["steps", "greater than or equal to 1"]),
    ({"steps": 2.5}, ["steps", "fractional"]),
    ({"train": {"beta": True}}, ["train.beta", "expected a number"]),
    ({"rollout": {"temperature": 0}}, ["rollout.temperature", "greater than 0"]),
    ({"rollout": {"top_p": 1.5}}, ["rollout.top_p", "less than or equal to 1"]),
    # Retired keys and layouts: each named with its fix.
    ({"rollout": {"sharding_style": "legacy"}}, ["rollout.sharding_style", "retired", "delete the key"]),
    ({"rollout": {"weight_layout": "tensor"}}, ["rollout.weight_layout", "retired", "head_groups"]),
    ({"rollout": {"weight_layout": "replicated"}}, ["rollout.weight_layout", "retired", "use auto"]),
    ({"rollout": {"weight_layout": "sideways"}}, ["rollout.weight_layout", "'fsdp'", "'megatron'"]),
    # Reproductions of the layout before issue 16, now the benchmark's (benchmarks/plan.py), not config keys.
    ({"rollout": {"activation_layout": "free"}}, ["rollout.activation_layout", "unknown key", "top_p"]),
    ({"rollout": {"partial_sums": "float32"}}, ["rollout.partial_sums", "unknown key"]),
    ({"rollout": {"cache_write": "bits"}}, ["rollout.cache_write", "unknown key"]),
    ({"rollout": {"n": 1}}, ["rollout.n", "at least 2 samples"]),
    ({"train": {"optimizer": "sgd"}}, ["train.optimizer", "adamw", "lion"]),
    ({"train": {"lr_schedule": "warmup_cosine", "warmup_steps": 10}}, ["train.warmup_steps", "lower it"]),
    ({"train": {"warmup_steps": 3}}, ["train.warmup_steps", "warmup_cosine"]),
    ({"mesh_shape": "1,-1,-1"}, ["mesh_shape", "more than one -1"]),
    ({"mesh_shape": "fsdp"}, ["mesh_shape", "auto, host_local"]),
    ({"mesh_shape": "2,0,1"}, ["mesh_shape", "not positive"]),
    ({"reward_weights": {"corect": 1.0}}, ["reward_weights", "did you mean 'correct'"]),
    ({"reward_weights": {"correct": 0}}, ["reward_weights", "non-zero"]),
    ({"checkpoint": {"every_steps": 5}}, ["checkpoint.every_steps", "checkpoint.dir"]),
    ({"wandb_mode": "online"}, ["wandb_project", "wandb_mode=disabled"]),
    ({"wandb_mode": "loud"}, ["wandb_mode", "online"]),
    ({"rollout": 8}, ["rollout", "valid dictionary"]),
    ({"model_path": None}, ["model_path"]),
]


@pytest.mark.parametrize("bad, words", BAD, ids=[str(b) for b, _ in BAD])
def test_bad_configs_are_rejected_with_the_key_and_fix(bad, words):
    with pytest.raises(ConfigError) as info:
        load_config(raw={**BASE, **bad})
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_missing_key_bad_yaml_and_bad_set(tmp_path):
    with pytest.raises(ConfigError, match="model_path: required key is missing"):
        load_config(raw={"steps": 1})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(raw=dict(BASE), overrides=["rollout.n"])
    with pytest.raises(ConfigError, match="steps is a value, not a section"):
        load_config(raw=dict(BASE), overrides=["steps.x=1"])


def test_environment_check_names_the_missing_files(tmp_path):
    cfg = load_config(raw={"model_path": str(tmp_path / "tiny"), "steps": 1,
                           "data": {"path": str(tmp_path / "gsm8k.jsonl")}})
    with pytest.raises(ConfigError) as info:
        check_environment(cfg)
    assert "make-tiny-model" in str(info.value) and "make-gsm8k-jsonl" in str(info.value)
    check_environment(load_config(raw=dict(BASE)))  # hub ids are not checked here


def test_topology_local_batch_must_divide_by_local_devices():
    # the v4-16 OOM sweep: 2 hosts x 4 devices; 1 prompt per process x 8 samples is fine, x 2 is not.
    cfg = load_config(raw={**BASE, "rollout": {"batch_size": 2, "n": 8}})
    check_topology(cfg, process_count=2, local_device_count=4, data_parallel=1, fsdp=8)
    cfg = load_config(raw={**BASE, "rollout": {"batch_size": 2, "n": 2}})
    with pytest.raises(ConfigError, match=r"local_batch = prompts_per_process \* n = 1 \* 2 = 2 .* 4 local"):
        check_topology(cfg, process_count=2, local_device_count=4, data_parallel=1, fsdp=8)
    cfg = load_config(raw={**BASE, "rollout": {"batch_size": 6, "n": 4}})
    with pytest.raises(ConfigError, match="do not split over 4 processes"):
        check_topology(cfg, process_count=4, local_device_count=4, data_parallel=1, fsdp=16)
    cfg = load_config(raw={**BASE, "rollout": {"batch_size": 16, "n": 8},
                           "train": {"micro_batch_size_per_device": 3}})
    with pytest.raises(ConfigError, match="micro_batch_size_per_device: 3 does not divide the 8"):
        check_topology(cfg, process_count=4, local_device_count=4, data_parallel=1, fsdp=16)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.wandb_mode in ("online", "offline", "disabled")


def test_shipped_benchmark_configs_match_the_benchmark_setups():
    names = {p.name for p in CONFIGS.glob("*.yaml")}
    assert {"tiny_local.yaml", "qwen25_3b_v6e8_bench.yaml", "qwen25_3b_v6e16_bench.yaml",
            "qwen25_7b_v4_16.yaml"} <= names
    for name, processes, local_devices in [("qwen25_3b_v6e8_bench.yaml", 1, 8),
                                           ("qwen25_3b_v6e16_bench.yaml", 4, 4)]:
        cfg = load_config(CONFIGS / name)
        assert cfg.rollout.batch_size * cfg.rollout.n == 128 and cfg.rollout.n == 8
        assert cfg.rollout.max_length_sample == 1024 and cfg.mesh_shape == "auto"
        check_topology(cfg, processes, local_devices, 1, processes * local_devices)
    cfg = load_config(CONFIGS / "qwen25_7b_v4_16.yaml")  # 2 hosts x 4 devices, local_batch 4 at 2048
    assert cfg.rollout.batch_size // 2 * cfg.rollout.n == 4
    check_topology(cfg, 2, 4, 1, 8)


def test_cli_print_config_and_config_error_event(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(BASE))
    assert cli.main(["--config", str(config), "--set", "rollout.n=4", "--print-config"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed["rollout"]["n"] == 4 and printed["train"]["optimizer"] == "adamw"
    assert "# digest: " in out

    status = cli.main(["--config", str(config), "--set", "rollout.nn=4", "--run-dir", str(tmp_path / "run")])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("error: invalid config: rollout.nn: unknown key") and err.count("\n") == 1
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "error" and events[-1]["type"] == "ConfigError"
    assert "rollout.nn" in events[-1]["message"] and events[-1]["process"] == 0


def test_cli_make_gsm8k_jsonl(tmp_path):
    out = tmp_path / "g.jsonl"
    assert cli.main(["make-gsm8k-jsonl", str(out), "--n", "7", "--seed", "1"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 7 and all("####" in r["answer"] for r in rows)


def test_oom_error_fields_name_local_batch_and_hint():
    exc = RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB\nmore detail")
    fields = cli.error_fields(exc, local_batch=8)
    assert fields["type"] == "RuntimeError" and fields["local_batch"] == 8
    assert "rollout.batch_size" in fields["hint"] and "fsdp" in fields["hint"]
    assert fields["message"] == "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB"
    assert "hint" not in cli.error_fields(ValueError("bad"), local_batch=8)
