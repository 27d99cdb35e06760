"""`launch --fail-fast`: a watcher that outlives the `launch` command and stops the run's other workers as
soon as one worker's job fails (in a multi-host job they would otherwise hang in a collective, holding the
TPU and billing, until someone notices).

`start_guard(run_id)` starts `python -m tpu_console.runs.guard RUN_ID` detached (its own session, output to
`$TPU_CONSOLE_HOME/guards/RUN_ID.log`). The guard runs a `RunWatch` with `fail_fast=True` until every worker
has ended, and leaves the run archived and summarised in the history like any watch that sees a run end.
It runs on the machine that launched (a worker cannot see the other workers); a laptop that sleeps pauses
it, and `tpu-console status` still names hung workers and the `stop` that ends them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tpu_console import locations


def guard_log(run_id: str) -> Path:
    return locations.home() / "guards" / f"{run_id}.log"


def start_guard(run_id: str, settings_flags: dict[str, Any] | None = None) -> int:
    """Start the detached fail-fast watcher of `run_id`; returns its pid."""
    log = guard_log(run_id)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "tpu_console.runs.guard", run_id, json.dumps(settings_flags or {})],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the launching terminal must not end it
            env=os.environ.copy(),
        )
    return process.pid


async def guard(run_id: str, settings_flags: dict[str, Any]) -> int:
    from tpu_console.providers.registry import build_providers, close_providers
    from tpu_console.runs.watch import RunWatch
    from tpu_console.settings import load_settings

    providers = build_providers(load_settings(settings_flags))
    try:
        async with RunWatch.open(providers, run_id, fail_fast=True, poll_s=0.5) as watch:
            print(f"{run_id}: watching {len(watch.record.workers)} worker(s), fail-fast", flush=True)
            health = await watch.run()
            if watch.survivors_stopped:
                print(
                    f"{run_id}: stopped worker(s) {watch.survivors_stopped} after the first failure",
                    flush=True,
                )
            print(f"{run_id}: {health.verdict}", flush=True)
    finally:
        await close_providers(providers)
    return 0


def main() -> int:
    run_id, flags = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    return asyncio.run(guard(run_id, flags))


if __name__ == "__main__":
    sys.exit(main())
