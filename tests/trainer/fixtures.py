"""Shared trainer fixtures: one tiny HF-format Qwen2 directory per test session (written by make-tiny-model).

The tests under tests/trainer/ get them from conftest.py there; a test module elsewhere with
    pytest_plugins = ("tests.trainer.fixtures",)
The directory is built once per process (however many modules import the fixture) and removed at exit.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import jax.numpy as jnp
import pytest

from trainer.tiny_model import TinySpec, make_tiny_model

# Unit-test size: 2 layers, hidden 64, 4 heads over 2 KV heads, vocab from the tiny BPE tokenizer (1024).
TINY_SPEC = TinySpec()


@functools.cache
def tiny_model_path() -> Path:
    root = Path(tempfile.mkdtemp(prefix="tiny-qwen2-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return make_tiny_model(root / "model", TINY_SPEC)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """Path of the tiny model directory (config.json, model.safetensors, tokenizer, chat template)."""
    return tiny_model_path()


@pytest.fixture
def tiny_model(tiny_model_dir):
    """(model, config) loaded in fp32 params and fp32 compute (exact comparisons)."""
    from trainer.weights import load_model

    return load_model(tiny_model_dir, compute_dtype=jnp.float32)
