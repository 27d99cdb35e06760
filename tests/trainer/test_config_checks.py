"""Config checks found on reading the trainer (issue 16): refused before any TPU time is spent."""

from __future__ import annotations

import json

import pytest
import yaml

from trainer import cli
from trainer.config import (
    ConfigError,
    check_environment,
    check_pod_shape,
    check_topology,
    load_config,
    wandb_key_available,
)
from trainer.distributed import ENV_PROCESS_ID

BASE = {"model_path": "Qwen/Qwen2.5-0.5B-Instruct", "steps": 1, "rollout": {"batch_size": 16, "n": 8}}


def test_the_default_layout_with_dp_1_is_accepted():
    # The rollout's rows are split over every device, so dp=1 (mesh_shape auto) replicates nothing.
    assert check_pod_shape(load_config(raw=dict(BASE)), 4, 4) == (1, 16, 1)
    check_topology(load_config(raw=dict(BASE)), 4, 4, data_parallel=1, fsdp=16)


def _online():
    return load_config(raw={**BASE, "wandb_mode": "online", "wandb_project": "p"})


@pytest.fixture
def no_wandb_key(tmp_path, monkeypatch):
    """No key anywhere wandb looks: no WANDB_API_KEY, an empty home without .netrc, no NETRC."""
    for name in ("WANDB_API_KEY", "NETRC", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_wandb_online_without_an_api_key_fails_on_every_process(tmp_path, no_wandb_key):
    with pytest.raises(ConfigError) as info:
        check_environment(_online())
    message = str(info.value)
    assert "\n" not in message
    assert "wandb_mode: online" in message and "WANDB_API_KEY" in message and ".env" in message
    assert "offline" in message and "disabled" in message
    for mode in ("offline", "disabled"):  # neither needs a key
        check_environment(load_config(raw={**BASE, "wandb_mode": mode, "wandb_project": "p"}))


def test_wandb_key_from_the_environment_or_netrc_is_accepted_and_never_printed(tmp_path, no_wandb_key,
                                                                                monkeypatch, capsys):
    secret = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    assert wandb_key_available()
    check_environment(_online())
    monkeypatch.setenv("WANDB_API_KEY", "  ")  # blank is no key
    assert not wandb_key_available()
    monkeypatch.delenv("WANDB_API_KEY")

    netrc_file = no_wandb_key / ".netrc"
    netrc_file.write_text("machine example.com\n  login user\n  password other\n")
    netrc_file.chmod(0o600)
    assert not wandb_key_available()  # an entry for another host is not W&B's
    netrc_file.write_text(f"machine api.wandb.ai\n  login user\n  password {secret}\n")
    assert wandb_key_available()
    check_environment(_online())

    other = tmp_path / "netrc-elsewhere"  # wandb reads the file NETRC names, and WANDB_BASE_URL's host
    other.write_text(f"machine wandb.example.org\n  login user\n  password {secret}\n")
    monkeypatch.setenv("NETRC", str(other))
    assert not wandb_key_available()
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert wandb_key_available()

    netrc_file.write_text("machine api.wandb.ai login")  # unreadable netrc: no key, not a traceback
    monkeypatch.delenv("NETRC")
    monkeypatch.delenv("WANDB_BASE_URL")
    assert not wandb_key_available()
    with pytest.raises(ConfigError) as info:
        check_environment(_online())
    out = capsys.readouterr()
    assert secret not in str(info.value) + out.out + out.err


def test_trainer_cli_refuses_wandb_online_without_a_key_on_a_non_zero_process(tmp_path, no_wandb_key,
                                                                               monkeypatch, capsys):
    monkeypatch.setenv(ENV_PROCESS_ID, "3")  # not process 0: before, only process 0 failed (in wandb.init)
    monkeypatch.setattr("trainer.train.run", lambda *a, **k: pytest.fail("the run started"), raising=False)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({**BASE, "wandb_mode": "online", "wandb_project": "p"}))
    assert cli.main(["--config", str(config), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: wandb_mode: online needs a W&B API key") and err.count("\n") == 1
    [event] = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert event["kind"] == "error" and event["type"] == "ConfigError" and event["process"] == 3
