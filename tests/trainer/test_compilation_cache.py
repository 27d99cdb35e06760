"""JAX's persistent compilation cache on the workers (trainer/compilation_cache.py): a second launch of the
same config loads its programs instead of compiling them."""

from __future__ import annotations

from tests.trainer.launch import launch, tiny_config
from trainer import telemetry as tm
from trainer.compilation_cache import ENV, cache_dir


def _last_step(result) -> dict:
    steps = [e for e in result.events if e["kind"] == "step"]
    assert steps, result.output[-3000:]
    return steps[-1]


def test_a_second_launch_loads_its_programs_from_the_cache(tmp_path, tiny_model_dir):
    config = tiny_config(tmp_path, tiny_model_dir, steps=1)
    cache = tmp_path / "compiled"
    env = {ENV: str(cache)}
    [first] = launch(tmp_path, config, 1, 2, extra_env=env, distributed=False, tag="first")
    assert first.returncode == 0, first.output[-3000:]
    assert any(cache.iterdir())
    [second] = launch(tmp_path, config, 1, 2, extra_env=env, distributed=False, tag="second")
    assert second.returncode == 0, second.output[-3000:]
    # Every program the first run compiled was kept, and the second loaded them all from the cache.
    compiled = _last_step(first)[tm.COMPILE_COUNT]
    assert compiled >= 5 and _last_step(first)[tm.COMPILE_CACHE_HITS] == 0
    assert _last_step(second)[tm.COMPILE_CACHE_HITS] == compiled


def test_the_cache_is_off_off_a_tpu_vm_unless_asked(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr("trainer.compilation_cache.has_tpu_chips", lambda: False)
    assert cache_dir() is None
    monkeypatch.setattr("trainer.compilation_cache.has_tpu_chips", lambda: True)
    assert str(cache_dir()).endswith(".cache/tpu-console/jax-compile")
    monkeypatch.setenv(ENV, "")
    assert cache_dir() is None
    monkeypatch.setenv(ENV, str(tmp_path))
    assert cache_dir() == tmp_path
