"""How the trainer stops on SIGTERM (a `tpu-console stop`, a supervisor's stop, a preemption notice): with a
checkpoint of the last finished step first, when checkpoints are on, so the next run resumes from it.

The signal handler (`handler`) records the signal and, where stopping at once is safe, raises `Terminated`
in the middle of whatever runs; the loop then saves the state of the last step whose update finished
(the rollout of the step under way is simply done again after the resume). Two places defer the stop to
the end of the step instead:

- the update and the periodic save (`StopGate.hold` until the step's event is written, `StopGate.deferred`
  around the save): the update donates the old weights, so a stop inside it could leave none whole to
  save, and a step whose update finished is recorded before the stop saves it;
- every step of a multi-process run with checkpoints: a save is a collective of every process, so they
  must stop at the same step; at each step's end they agree (`StopGate.agreed`: one small all-gather of
  "was I signalled") and all stop there when any was.

The console's job runner writes the preemption notice to the file `TPU_CONSOLE_PREEMPTION_FILE` names
before it sends SIGTERM (docs/contract.md): `notice()` reads it, so the checkpoint's event can say how long
the save took from the notice and how many of the VM's seconds were left.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator

from trainer.distributed import Terminated

PREEMPTION_FILE_ENV = "TPU_CONSOLE_PREEMPTION_FILE"


def handler(progress: dict):
    """A SIGTERM/SIGINT handler over the run's `progress` dict (shared with the CLI's error event)."""

    def on_signal(signum: int, frame: object) -> None:
        progress.setdefault("stop_signal", signum)
        progress.setdefault("stop_at", time.time())
        if progress.get("defer_stop"):
            return  # the loop stops at the end of the step
        # Raise now; and since library code may swallow an exception raised in the middle of it, the flag
        # left above is checked by the loop at every step boundary too.
        raise Terminated(signum)

    return on_signal


class StopGate:
    """Where the loop may stop: `deferred()` sections run whole, `agreed()` at each step's end."""

    def __init__(self, progress: dict, process_count: int, checkpoints: bool) -> None:
        self.progress = progress
        # every process must save at the same step, so a multi-process run with checkpoints stops only at
        # the step's end, all together
        self.together = checkpoints and process_count > 1
        if self.together:
            progress["defer_stop"] = True

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        if self.together:
            yield
            return
        self.progress["defer_stop"] = True
        try:
            yield
        finally:
            self.progress["defer_stop"] = False

    def hold(self) -> None:
        """From the update on, a stop waits for `release()`: the step is finished and recorded first."""
        if not self.together:
            self.progress["defer_stop"] = True

    def release(self) -> None:
        if not self.together:
            self.progress["defer_stop"] = False

    def agreed(self) -> bool:
        """Whether the run stops now: signalled here (one process), or on any process (several)."""
        signalled = bool(self.progress.get("stop_signal"))
        if not self.together:
            return signalled
        import numpy as np
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.array([int(signalled)], np.int32), tiled=True)
        return bool(np.asarray(flags).any())

    def signum(self) -> int:
        import signal

        return int(self.progress.get("stop_signal") or signal.SIGTERM)


def notice() -> dict | None:
    """The preemption notice the job runner wrote, if any: {source, seen_at, deadline, seconds_left, ...}."""
    path = os.environ.get(PREEMPTION_FILE_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
