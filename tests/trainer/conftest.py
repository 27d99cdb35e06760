"""Fixtures for the trainer's tests: the tiny Qwen2 model (tests/trainer/fixtures.py, which tests elsewhere
load with `pytest_plugins`)."""

from tests.trainer.fixtures import tiny_model, tiny_model_dir  # noqa: F401 - fixtures
