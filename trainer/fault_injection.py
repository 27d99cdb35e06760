"""A test facility: faults a test arms through the environment, so that the console's handling of them can
be tested on CPU, where they never happen. Nothing here is reachable from a config file, and production
never sets these variables.

- `TRAINER_FAULT_MAX_LOCAL_BATCH=N`: a run whose local batch exceeds N fails at start exactly as an
  out-of-memory step does (RESOURCE_EXHAUSTED, the `error` event with the local batch, exit 1). The
  console's batch sweep is tested with it.
- `TRAINER_FAULT_DISTRIBUTED_TIMEOUT_AFTER_STEP=N`: a run that started from scratch (not resumed from a
  checkpoint at step N or later) fails right after step N as a peer that never reaches a barrier does
  (DEADLINE_EXCEEDED). Started again, it resumes from its checkpoint and goes on: the supervisor's restart
  on a transient failure is tested with it.
"""

from __future__ import annotations

import os

MAX_LOCAL_BATCH = "TRAINER_FAULT_MAX_LOCAL_BATCH"
TIMEOUT_AFTER_STEP = "TRAINER_FAULT_DISTRIBUTED_TIMEOUT_AFTER_STEP"


def raise_armed_faults(local_batch: int) -> None:
    """Raise the failure a test armed for this run, if any."""
    limit = os.environ.get(MAX_LOCAL_BATCH)
    if limit and local_batch > int(limit):
        raise RuntimeError(f"RESOURCE_EXHAUSTED: simulated device memory limit ({MAX_LOCAL_BATCH}={limit}): "
                           f"local_batch {local_batch} > {limit}")


def armed_step_fault(step: int, resumed_from: int) -> Exception | None:
    """The failure a test armed for the end of `step` (its checkpoint written), if any."""
    after = os.environ.get(TIMEOUT_AFTER_STEP)
    if after and step == int(after) and resumed_from < step:
        return RuntimeError(f"DEADLINE_EXCEEDED: Barrier timed out (simulated by {TIMEOUT_AFTER_STEP}="
                            f"{after} after step {step})")
    return None
