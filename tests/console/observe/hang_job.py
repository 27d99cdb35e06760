"""A program that knows nothing of tpu-console and hangs as a multi-host job does: `hang_job.py STEPS
LATE_WORKER`: every worker prints STEPS step lines, then the others wait forever in `all_reduce` while worker
LATE_WORKER never gets there, stuck in `load_batch`. The standard library only."""

import os
import sys
import threading
import time


def all_reduce():
    threading.Event().wait()  # the peers that never come


def load_batch():
    while True:
        time.sleep(1)


def main(steps, late_worker):
    worker = int(os.environ["TPU_CONSOLE_WORKER"])
    for step in range(1, int(steps) + 1):
        time.sleep(0.2)
        print(f"step={step} loss=1.0 dt=0.200s", flush=True)
    if worker == int(late_worker):
        load_batch()
    all_reduce()


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
