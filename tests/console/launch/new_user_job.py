"""The first program a new user writes, run on a local pod from a project of its own: one step line a
step (`step 5 | loss 0.6971 | 0.05 s/step`), then, on the workers named, a `KeyError` with a traceback.
The tests of what a user sees (the first failure, the last error whole, `runs show`) launch it with
`launch_new_user_job`, through a job file whose project is synced before the launch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.console.launch.test_local import run

STEP_REGEX = r"step (?P<step>\d+) \| loss (?P<loss>[\d.]+) \| (?P<step_s>[\d.]+) s/step"

# argv: STEPS, then WORKER=SECONDS for each worker that fails, after that many seconds past its last step.
TRAIN_PY = '''\
import os
import sys
import time


def lookup(config, key):
    return config[key]


def main(steps, failing):
    worker = int(os.environ["TPU_CONSOLE_WORKER"])
    for step in range(1, steps + 1):
        time.sleep(0.05)
        print(f"step {step} | loss {1.0 / step:.4f} | 0.05 s/step", flush=True)
    if str(worker) in failing:
        time.sleep(float(failing[str(worker)]))
        lookup({"x": 1}, "y")


if __name__ == "__main__":
    main(int(sys.argv[1]), dict(arg.split("=") for arg in sys.argv[2:]))
'''


def launch_new_user_job(capsys, tmp_path: Path, steps: int, *failing: str) -> str:
    """Launch train.py STEPS [WORKER=SECONDS ...] on `pod` from a project folder; its run id."""
    return launch_in_project(capsys, tmp_path, {"train.py": TRAIN_PY}, ["train.py", str(steps), *failing],
                             metrics=f"[metrics]\nformat = \"regex\"\nregex = '{STEP_REGEX}'\n")


def launch_in_project(
    capsys, tmp_path: Path, files: dict[str, str], argv: list[str], metrics: str = ""
) -> str:
    """Launch `python ARGV...` on `pod` from a project folder holding `files`, through a job file (its
    project synced first); its run id."""
    project = tmp_path / "my-project"
    project.mkdir(exist_ok=True)
    for name, text in files.items():
        (project / name).write_text(text)
    job_file = tmp_path / "job.toml"
    job_file.write_text(f"command = {json.dumps(' '.join([sys.executable, *argv]))}\n"
                        '[project]\ndir = "my-project"\n' + metrics)
    status, out, err = run(capsys, "launch", "pod", "--json", "--job", str(job_file))
    assert status == 0, err
    result = json.loads(out)
    assert result["started"], result
    return result["run_id"]
