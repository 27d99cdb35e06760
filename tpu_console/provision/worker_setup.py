"""The worker's side of `tpu-console setup`: run on every worker by its base Python (python.json's, fed
this file on stdin; standard library only), in the current project's folder (project.json).

The environment is `~/tpu-console/envs/<digest>/`, a venv keyed by the setup command, the requirement
files' contents and the Python version: an unchanged setup finds its stamp there and answers "already in
place"; a changed one gets a new environment, and the old one stays for runs that still use it.
`setup.json` is written only when the command succeeded. Prints the `@@ ` lines of
tpu_console/provision/report.py; the command's own output goes through as it comes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime

HOME = os.path.expanduser("~")
ROOT = "tpu-console"
# The files that describe a project's dependencies, when `--requirements` names none.
USUAL_REQUIREMENTS = (
    "requirements.txt", "requirements-tpu.txt", "pyproject.toml", "uv.lock", "setup.py", "setup.cfg",
    "poetry.lock",
)
STAMP = ".tpu-console-setup"
# Exit statuses of bad input (the console turns them into one line and exit 2), apart from the command's.
NO_PROJECT, NO_REQUIREMENT, NO_PYTHON, NO_ENV = 41, 42, 43, 44


def say(kind: str, text: str) -> None:
    print(f"@@ {kind} {text}", flush=True)


def read_json(relative: str) -> dict | None:
    try:
        with open(os.path.join(HOME, relative)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(relative: str, record: dict) -> str:
    text = json.dumps(record, sort_keys=True)
    path = os.path.join(HOME, relative)
    with open(path + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(path + ".tmp", path)
    return text


def python_version(python: str) -> str | None:
    try:
        done = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                              capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def fits(version: str | None, wanted: str | None) -> bool:
    if version is None:
        return False
    if wanted is None:
        return True
    have = tuple(int(p) for p in version.split(".")[:2])
    return have >= tuple(int(p) for p in wanted.split("."))


def find_uv() -> str | None:
    for candidate in (shutil.which("uv"), f"{HOME}/{ROOT}/env/bin/uv", f"{HOME}/{ROOT}/uv/bin/uv",
                      f"{HOME}/.local/bin/uv"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def pick_python(base: str | None, wanted: str | None) -> str | None:
    """bootstrap's interpreter when it is new enough, else a python3.X on PATH, else what uv finds."""
    candidates = [base] if base else []
    if wanted:
        candidates.append(shutil.which(f"python{wanted}") or "")
        uv = find_uv()
        if uv:
            found = subprocess.run([uv, "python", "find", "--no-project", f">={wanted}"], cwd=HOME,
                                   capture_output=True, text=True, timeout=60, check=False)
            candidates.append(found.stdout.strip() if found.returncode == 0 else "")
    for candidate in candidates:
        if candidate and fits(python_version(candidate), wanted):
            return candidate
    return None


def file_digest(path: str) -> str:
    total = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            total.update(block)
    return total.hexdigest()


def make_env(env: str, python: str) -> bool:
    """A venv with pip in it (commands such as `pip install -r` expect one): `python -m venv`, which needs
    no network; else uv (Ubuntu's python3 lacks ensurepip without python3-venv), which fetches pip."""
    attempts = [[python, "-m", "venv", env]]
    if uv := find_uv():
        attempts.append([uv, "venv", "-q", "--seed", "--python", python, env])
    said: list[str] = []
    for command in attempts:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0 and os.access(os.path.join(env, "bin", "pip"), os.X_OK):
            return True
        said = (done.stderr or done.stdout).strip().splitlines() or said
        shutil.rmtree(env, ignore_errors=True)  # never leave a half-made environment to be taken for one
    say("error", f"making the environment failed: {said[-1] if said else 'no pip in it'}; install "
        "python3-venv on the worker")
    return False


def run_command(command: str, folder: str, env: str) -> int:
    """The setup command with the environment active, in the project's folder; its output as it comes."""
    variables = dict(os.environ)
    variables.update({
        "VIRTUAL_ENV": env,
        "UV_PROJECT_ENVIRONMENT": env,  # `uv sync` fills this environment, not a .venv in the project
        "PATH": os.pathsep.join([f"{env}/bin", variables.get("PATH", ""), f"{HOME}/{ROOT}/env/bin",
                                 f"{HOME}/{ROOT}/uv/bin"]),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    })
    variables.pop("PYTHONHOME", None)
    process = subprocess.Popen(["bash", "-c", command], cwd=folder, env=variables, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    last = ""
    assert process.stdout is not None
    for line in process.stdout:
        print(line, end="", flush=True)
        last = line.strip() or last
    status = process.wait()
    if status != 0:
        say("error", f"`{command}` exited {status}" + (f": {last}" if last else ""))
    return status


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tpu-console-setup")
    parser.add_argument("--command", required=True)
    parser.add_argument("--requirement", action="append", default=[])
    parser.add_argument("--python-version")
    parser.add_argument("--node", default="NODE")  # for the fixes the messages name
    args = parser.parse_args(argv)

    project = read_json(f"{ROOT}/project.json")
    folder = os.path.join(HOME, project["dir"]) if project and project.get("dir") else None
    if folder is None or not os.path.isdir(folder):
        say("error", f"no project on this worker; run `tpu-console sync {args.node} --dir PATH` (or --git) "
            "first")
        return NO_PROJECT
    missing = [r for r in args.requirement if not os.path.isfile(os.path.join(folder, r))]
    if missing:
        say("error", f"{missing[0]} is not in the project {project.get('name')} ({project.get('digest')}); "
            "name a file the project holds, relative to its folder")
        return NO_REQUIREMENT
    named = args.requirement or [r for r in USUAL_REQUIREMENTS if os.path.isfile(os.path.join(folder, r))]
    base = (read_json(f"{ROOT}/python.json") or {}).get("python")
    python = pick_python(base, args.python_version)
    if python is None:
        wanted = args.python_version or "3.11"
        say("error", f"no Python {wanted} on this worker; `tpu-console bootstrap {args.node} "
            f"--python-version {wanted}` gets one")
        return NO_PYTHON
    version = python_version(python) or "?"
    requirements = {r: file_digest(os.path.join(folder, r)) for r in named}
    key = json.dumps({"command": args.command, "requirements": requirements, "python": version},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    env_relative = f"{ROOT}/envs/{digest}"
    env = os.path.join(HOME, env_relative)
    record = {"digest": digest, "env": env_relative, "command": args.command, "requirements": requirements,
              "project_digest": project.get("digest"), "python": version}

    if os.path.isfile(os.path.join(env, STAMP)):
        record["finished_at"] = (read_json(f"{env_relative}/{STAMP}") or {}).get("finished_at")
        say("setup", write_json(f"{ROOT}/setup.json", record))
        say("ready", "already")
        return 0
    if not os.access(os.path.join(env, "bin", "pip"), os.X_OK):
        say("step", f"creating ~/{env_relative} (Python {version})")
        os.makedirs(os.path.dirname(env), exist_ok=True)
        if not make_env(env, python):
            return NO_ENV
    say("step", f"running `{args.command}` in ~/{project['dir']}")
    status = run_command(args.command, folder, env)
    if status != 0:
        return status
    record["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    write_json(f"{env_relative}/{STAMP}", record)
    say("setup", write_json(f"{ROOT}/setup.json", record))
    say("ready", "installed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
