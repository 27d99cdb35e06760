"""Where tpu-console keeps its files. Everything lives under one home folder, `TPU_CONSOLE_HOME`,
defaulting to the platform's user data dir, so a test (or a second profile) can point it elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def home() -> Path:
    env = os.environ.get("TPU_CONSOLE_HOME")
    path = Path(env).expanduser() if env else Path(platformdirs.user_data_dir("tpu-console", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def config_file() -> Path:
    return home() / "config.toml"


def keys_dir() -> Path:
    """The console's own SSH client key lives here (created on first use)."""
    path = home() / "keys"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def local_pods_dir() -> Path:
    """The local provider's simulated pods: one folder per node, one sub-folder per worker."""
    path = home() / "local"
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_file() -> Path:
    return home() / "console.sqlite"
