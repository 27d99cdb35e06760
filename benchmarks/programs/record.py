"""Record a corpus program's real output as the console sees it, for tests/console/worker/program_outputs/.

    python benchmarks/programs/record.py benchmarks/programs/loop_pipes --venv /work/corpus/loop_pipes-venv \
        --package jax [--steps N] [--out tests/console/worker/program_outputs]

Runs the folder's program.toml `command` in that folder the way a job runs under the console
(tpu_console/worker/job_wrapper.sh): PYTHONUNBUFFERED=1, stdin from /dev/null, stdout and stderr both into
one regular file, no terminal (TERM, COLUMNS and LINES unset), the venv's bin first on PATH as `setup` puts
it. Writes `<name>.log`, the raw bytes (\\r and \\b kept), and `<name>.json`: the program and its version,
the command, `steps` (`--steps`, else the highest step program.toml's `truth` matches, else its `steps`),
`last_step` (that highest step), the program's own step time (the median of what `step_time` matches; its
named group `s`, `ms` or `us` gives the unit, `per_s` a rate), the wall time per step measured here from
when each step's line reached the file (its size is polled every 5 ms), and the last loss `loss` matches.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import tomllib

UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}  # a step_time group's name: its value's unit
RATE = "per_s"  # a step_time group of steps per second (tqdm's `it/s`)


def run_into_file(command, cwd, env, log_path):
    """Run command with its output in log_path; return [(seconds since start, file size)] at each growth."""
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


def seconds(match):
    """A step_time match in seconds, whichever unit group matched."""
    for unit, scale in UNITS.items():
        if unit in match.re.groupindex and match.group(unit) is not None:
            return float(match.group(unit)) * scale
    if RATE in match.re.groupindex and match.group(RATE) is not None:
        return 1.0 / float(match.group(RATE))
    raise ValueError(f"step_time regex {match.re.pattern!r} has no group s, ms, us or per_s that matched")


def summarize(program, text, growth):
    """The figures of one recording, from program.toml's regexes over the output."""
    figures = {"last_step": None, "step_time_s": None, "wall_step_time_s": None, "loss": None}
    if "truth" in program:
        steps = [(int(m.group("step")), m.start()) for m in re.finditer(program["truth"], text)]
        if steps:
            first_step, first_at = steps[0]
            last_step, last_at = max(steps, key=lambda s: (s[0], -s[1]))
            figures["last_step"] = last_step
            if last_step > first_step:
                figures["wall_step_time_s"] = round(
                    (arrival(growth, last_at) - arrival(growth, first_at)) / (last_step - first_step), 4)
    if "step_time" in program:
        times = [seconds(m) for m in re.finditer(program["step_time"], text)]
        figures["step_time_s"] = round(statistics.median(times), 6) if times else None
    if "loss" in program:
        losses = [float(m.group("loss")) for m in re.finditer(program["loss"], text)]
        figures["loss"] = losses[-1] if losses else None
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the program's project folder (holds program.toml)")
    parser.add_argument("--venv", required=True, help="a venv made from the folder's requirements.txt")
    parser.add_argument("--package", required=True, help="the distribution whose version names the program")
    parser.add_argument("--steps", type=int, help="steps made, where the highest step shown is not")
    parser.add_argument("--out", default="tests/console/worker/program_outputs")
    args = parser.parse_args()

    folder = os.path.abspath(args.folder)
    name = os.path.basename(folder)
    with open(os.path.join(folder, "program.toml"), "rb") as f:
        program = tomllib.load(f)
    env = {k: v for k, v in os.environ.items() if k not in ("TERM", "COLUMNS", "LINES")}
    env.update(PYTHONUNBUFFERED="1", PATH=os.path.join(args.venv, "bin") + os.pathsep + env["PATH"])
    python = os.path.join(args.venv, "bin", "python")
    version = subprocess.run(
        [python, "-c", f"import importlib.metadata as m; print(m.version({args.package!r}))"],
        check=True, capture_output=True, text=True).stdout.strip()

    log_path = os.path.join(args.out, f"{name}.log")
    status, growth = run_into_file(program["command"], folder, env, log_path)
    with open(log_path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    figures = summarize(program, text, growth)
    steps = args.steps or figures["last_step"] or program.get("steps")
    record = {
        "program": name,
        "version": f"{args.package} {version}",
        "command": (f"{' '.join(program['command'])} in benchmarks/programs/{name}, recorded by "
                    f"benchmarks/programs/record.py (PYTHONUNBUFFERED=1, stdin /dev/null, stdout+stderr into "
                    f"one file, no terminal; Python {sys.version.split()[0]}, a venv from requirements.txt)"),
        "exit_status": status,
        "steps": steps,
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
