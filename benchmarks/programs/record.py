"""Record a corpus program's real output as the console sees it, for tests/console/worker/program_outputs/.

    python benchmarks/programs/record.py benchmarks/programs/loop_pipes --venv /work/corpus/loop_pipes-venv

Runs the folder's program.toml `command` in a fresh copy of the folder (as `sync --dir` leaves it: nothing
from an earlier run) the way a job runs under the console (tpu_console/worker/job_wrapper.sh):
PYTHONUNBUFFERED=1, stdin from /dev/null, stdout and stderr both into one regular file, no terminal (TERM,
COLUMNS and LINES unset), the job runner's TERMINAL_ENV (Rich redraws as it goes), the venv's bin first on
PATH as `setup` puts it. Writes `<name>.log`, the raw
bytes (\\r and \\b kept), and `<name>.json`: the program and its version (program.toml's `package`, else
the first of requirements.txt), the command, `steps` (the steps `truth` matches, a match repeating the one
before it being a redraw of the same step, as benchmarks/program_rows.py counts them; else program.toml's
`steps`), `last_step` (the last of them), the program's own step time (the median of what `step_time`
matches, one a step where `truth` tells the steps, as program_rows.py has it; its named group `s`, `ms` or
`us` gives the unit, `per_s` a rate), the wall time per step measured
here from when the first and last steps' lines reached the file (its size is polled every 5 ms), the
median time per step from one poll's step lines to the next's (`arrived_step_time_s`), the median time per
step between consecutive step lines by the times they give themselves
(`stamped_step_time_s`, where they give one: absl's prefix, Python logging's asctime, ISO 8601, as
benchmarks/program_rows.py reads them), and the last loss `loss` matches. Where the program prints no step
time (`step_time_measured`), its step time is the stamped one where there is one (`step_time_stamped`),
else the arrived one measured here.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tomllib

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [BENCHMARKS, os.path.dirname(BENCHMARKS)]  # program_rows.py, and the checkout it reads with
from program_rows import arrived_step_s, printed_step_times, stamped_step_s  # noqa: E402 - after its path

from tpu_console.worker.job_runner import TERMINAL_ENV  # noqa: E402 - found by the path above


def run_into_file(command, cwd, env, log_path):
    """Run command with its output in log_path; return its status and [(seconds since start, file size)]
    at each time the file grew."""
    growth, done = [], threading.Event()
    with open(log_path, "wb") as log, open(os.devnull, "rb") as devnull:
        start = time.monotonic()
        job = subprocess.Popen(command, cwd=cwd, env=env, stdin=devnull, stdout=log, stderr=subprocess.STDOUT)

        def poll():
            size = 0
            while not done.is_set():
                now = os.path.getsize(log_path)
                if now > size:
                    growth.append((time.monotonic() - start, now))
                    size = now
                time.sleep(0.005)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        status = job.wait()
        done.set()
        poller.join()
    growth.append((time.monotonic() - start, os.path.getsize(log_path)))
    return status, growth


def arrival(growth, offset):
    """When the byte at offset reached the file."""
    return next(t for t, size in growth if size > offset)


def made_steps(program, text):
    """(step, offset) of each step `truth` matches; a match repeating the step before it is a redraw."""
    steps = []
    for match in re.finditer(program["truth"], text):
        step = int(match.group("step"))
        if not steps or steps[-1][0] != step:
            steps.append((step, match.start()))
    return steps


def summarize(program, text, growth):
    """The figures of one recording, from program.toml's regexes over the output."""
    figures = {"steps": program.get("steps"), "last_step": None, "step_time_s": None,
               "wall_step_time_s": None, "arrived_step_time_s": None, "stamped_step_time_s": None,
               "loss": None}
    if "truth" in program:
        steps = made_steps(program, text)
        figures["steps"] = len(steps)
        if steps:
            (first, first_at), (last, last_at) = steps[0], steps[-1]
            figures["last_step"] = last
            if last > first:
                wall = (arrival(growth, last_at) - arrival(growth, first_at)) / (last - first)
                figures["wall_step_time_s"] = round(wall, 4)
            arrived = arrived_step_s(steps, growth)
            figures["arrived_step_time_s"] = round(arrived, 6) if arrived is not None else None
            stamped = stamped_step_s(text, steps)
            figures["stamped_step_time_s"] = round(stamped, 6) if stamped is not None else None
    if "step_time" in program:  # one a step where truth tells the steps, as program_rows.py has it
        steps = made_steps(program, text) if "truth" in program else None
        times = printed_step_times(text, re.compile(program["step_time"]), steps)
        figures["step_time_s"] = round(statistics.median(times), 6) if times else None
    # where the program prints no step time of its own, its measured one stands for it (as program_rows.py
    # has it): by its step lines' own times where they give them, else by when they reached the file
    untimed = figures["step_time_s"] is None
    figures["step_time_stamped"] = untimed and figures["stamped_step_time_s"] is not None
    figures["step_time_measured"] = figures["step_time_stamped"] or (
        untimed and figures["arrived_step_time_s"] is not None)
    if figures["step_time_measured"]:
        figures["step_time_s"] = figures["stamped_step_time_s"] or figures["arrived_step_time_s"]
    if "loss" in program:
        losses = [float(m.group("loss")) for m in re.finditer(program["loss"], text)]
        figures["loss"] = losses[-1] if losses else None
    return figures


def package_of(program, folder):
    """The distribution that names the program: program.toml's `package`, else requirements.txt's first."""
    if "package" in program:
        return program["package"]
    with open(os.path.join(folder, "requirements.txt")) as f:
        return re.match(r"[A-Za-z0-9][\w.-]*", f.readline()).group(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the program's project folder (holds program.toml)")
    parser.add_argument("--venv", required=True, help="a venv made from the folder's requirements.txt")
    parser.add_argument("--out", default="tests/console/worker/program_outputs")
    args = parser.parse_args()

    folder = os.path.abspath(args.folder)
    name = os.path.basename(folder)
    with open(os.path.join(folder, "program.toml"), "rb") as f:
        program = tomllib.load(f)
    env = {k: v for k, v in os.environ.items() if k not in ("TERM", "COLUMNS", "LINES")}
    env.update(TERMINAL_ENV)
    env.update(PYTHONUNBUFFERED="1", PATH=os.path.join(args.venv, "bin") + os.pathsep + env["PATH"])
    package = package_of(program, folder)
    version = subprocess.run(
        [os.path.join(args.venv, "bin", "python"), "-c",
         f"import importlib.metadata as m; print(m.version({package!r}))"],
        check=True, capture_output=True, text=True).stdout.strip()

    log_path = os.path.abspath(os.path.join(args.out, f"{name}.log"))
    with tempfile.TemporaryDirectory() as scratch:
        copy = shutil.copytree(folder, os.path.join(scratch, name))
        status, growth = run_into_file(program["command"], copy, env, log_path)
    with open(log_path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    figures = summarize(program, text, growth)
    terminal = " ".join(f"{k}={v}" for k, v in TERMINAL_ENV.items())
    record = {
        "program": name,
        "version": f"{package} {version}",
        "command": (f"{' '.join(program['command'])} in a copy of benchmarks/programs/{name}, recorded by "
                    f"benchmarks/programs/record.py (PYTHONUNBUFFERED=1, stdin /dev/null, stdout+stderr into "
                    f"one file, no terminal, {terminal}; Python {sys.version.split()[0]}, a venv from "
                    "requirements.txt)"),
        "exit_status": status,
        **figures,
        "has_loss": figures["loss"] is not None,
        "wall_s": round(growth[-1][0], 2),
    }
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    print(json.dumps(record, indent=2))
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
