"""JAX's persistent compilation cache on the workers: a second launch of the same config skips the compile.

Compiling Qwen2.5-3B's programs for a TPU takes minutes (the planner's compile of the same programs shows
it). With the cache, XLA's executables are kept on the worker's disk, keyed by the program, the devices and
the versions, and a relaunch (a restart after a failure, the next run of a sweep) loads them instead.

On by default on a TPU VM (`~/.cache/tpu-console/jax-compile`); elsewhere only when asked:
`TRAINER_COMPILATION_CACHE=DIR` turns it on there (and moves it), `TRAINER_COMPILATION_CACHE=` (empty) off.
Set before JAX starts its backends, so it works before `jax.distributed.initialize`.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainer.distributed import has_tpu_chips

ENV = "TRAINER_COMPILATION_CACHE"
DEFAULT_DIR = Path("~/.cache/tpu-console/jax-compile")


def cache_dir() -> Path | None:
    """Where compiled programs are kept on this worker, or None when the cache is off."""
    if ENV in os.environ:
        value = os.environ[ENV].strip()
        return Path(value).expanduser() if value else None
    return DEFAULT_DIR.expanduser() if has_tpu_chips() else None


def enable() -> Path | None:
    """Point JAX at the cache (no backend is started). Returns the folder, or None when off."""
    folder = cache_dir()
    if folder is None:
        return None
    import jax

    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    # Every program, however quick to compile: the point is the slow ones, and the quick ones cost a file.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
