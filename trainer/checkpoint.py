"""Orbax checkpoints of the training state (params, optimizer state, step) and resume from the latest one.

On a multi-host pod every process writes its own shards and process 0 the metadata, so `checkpoint.dir` must
be storage all workers share (a gs:// bucket or NFS); on one host any folder works. A step's folder appears
only once it is whole (orbax writes a temporary folder and renames it), so a save cut short by the VM's end
leaves the previous checkpoint as the latest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpointer:
    def __init__(self, directory: str, every_steps: int, max_to_keep: int) -> None:
        path = directory if "://" in directory else str(Path(directory).expanduser().resolve())
        self.every_steps = every_steps
        self._manager = ocp.CheckpointManager(
            path, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def should_save(self, step: int, last_step: int) -> bool:
        return (self.every_steps > 0 and step % self.every_steps == 0) or step == last_step

    def save(self, step: int, state: Any) -> None:
        """Save `state` (a pytree of arrays) as `step`; returns once the write is started (async)."""
        self._manager.save(step, args=ocp.args.StandardSave(state))

    def save_now(self, step: int, state: Any) -> bool:
        """Save `state` as `step` and return once it is complete on disk (the checkpoint of a stop): a save
        still being written is finished first, and a step already saved is not written again. Whether it
        wrote one."""
        self._manager.wait_until_finished()
        if step in self._manager.all_steps():
            return False
        self._manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self._manager.wait_until_finished()
        return True

    def restore(self, step: int, like: Any) -> Any:
        """Restore `step` with the structure, dtypes and shardings of `like`."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
