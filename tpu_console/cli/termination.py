"""SIGTERM and SIGHUP (a CI job cancelled, a terminal closed) handled like Ctrl-C while a verb waits on
something that must not be left behind, such as a queued create holding quota: the waiting task is
cancelled, so the same clean-up runs, and the caller learns which signal it was (nobody is there to ask,
so the clean-up proceeds without a question).

Only the first signal cancels; later ones are ignored until the block ends, so a CI runner's repeated
SIGTERM does not cut the clean-up short (its SIGKILL still does: nothing can catch that)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@dataclass
class Termination:
    signal: signal.Signals | None = None

    @property
    def exit_status(self) -> int:
        """128 + N, as a shell reports a process ended by signal N."""
        return 128 + int(self.signal or signal.SIGTERM)


@contextlib.contextmanager
def cancel_on_termination() -> Iterator[Termination]:
    """Within the block, SIGTERM or SIGHUP cancels the current task (once) and is recorded."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    termination = Termination()

    def terminate(signum: signal.Signals) -> None:
        if termination.signal is None:
            termination.signal = signum
            if task is not None:
                task.cancel()

    installed = []
    for signum in SIGNALS:
        try:
            loop.add_signal_handler(signum, terminate, signum)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal
            continue
        installed.append(signum)
    try:
        yield termination
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
