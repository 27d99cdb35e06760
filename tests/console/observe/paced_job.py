"""A program that knows nothing of tpu-console, stepping at its own pace: `paced_job.py STEPS SECONDS
SLOW_WORKER FACTOR`: every worker prints `step=N loss=1.0 dt=S` lines SECONDS apart, worker SLOW_WORKER
FACTOR times slower (it waits for its "input" before each step). The standard library only."""

import os
import sys
import time


def main(steps, seconds, slow_worker, factor):
    worker = int(os.environ["TPU_CONSOLE_WORKER"])
    pause = float(seconds) * (float(factor) if worker == int(slow_worker) else 1.0)
    for step in range(1, int(steps) + 1):
        time.sleep(pause)
        print(f"step={step} loss=1.0 dt={pause:.3f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
