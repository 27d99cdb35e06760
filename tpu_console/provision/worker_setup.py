"""The worker's side of `tpu-console setup`: run on every worker by its base Python (python.json's, fed
this file on stdin; standard library only), in the current project's folder (project.json).

The environment is `~/tpu-console/envs/<digest>/`, a venv keyed by the setup command, the requirement
files' contents, the Python version and what bootstrap installed: an unchanged setup finds its stamp there
and answers "already in place"; a changed one gets a new environment, and the old one stays for runs that
still use it.

It starts from bootstrap's environment (`~/tpu-console/env`, JAX for this machine): a `.pth` file has it
see bootstrap's site-packages after its own, so the command adds to them (pip finds `jax` satisfied, and a
pinned other version installs into the new environment, in front). Where the Pythons differ it cannot, and
says so before the command runs.

A setup that installed the project itself (`pip install -e .`, `pip install .`, `uv sync`: a distribution
whose direct_url.json, .egg-link or .pth names a folder under `~/tpu-console/projects/`) is tied to the
project synced then: after a sync of another, the same setup runs its command again in the same
environment (deps already there, only the project reinstalled), unless a live run still works in it.
Launch refuses to run a command in such an environment while it holds another project than the synced one.

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
import urllib.parse
from datetime import UTC, datetime

HOME = os.path.expanduser("~")
ROOT = "tpu-console"
# The files that describe a project's dependencies, when `--requirements` names none.
USUAL_REQUIREMENTS = (
    "requirements.txt", "requirements-tpu.txt", "pyproject.toml", "uv.lock", "setup.py", "setup.cfg",
    "poetry.lock",
)
STAMP = ".tpu-console-setup"
BOOTSTRAP_ENV = f"{ROOT}/env"  # bootstrap's environment, which a setup's starts from
BOOTSTRAP_STAMP = ".tpu-console-bootstrap"  # its digest of what bootstrap installed
BASE_PTH = "_tpu_console_bootstrap.pth"
PROJECTS = f"{ROOT}/projects"
# Exit statuses of bad input (the console turns them into one line and exit 2), apart from the command's.
NO_PROJECT, NO_REQUIREMENT, NO_PYTHON, NO_ENV, ENV_IN_USE = 41, 42, 43, 44, 45
# Asked of an environment's interpreter: its site folders, its Python, its jax (importlib.metadata only).
_SITE_PY = """
import json, sys, sysconfig
from importlib import metadata
try:
    jax = metadata.version("jax")
except metadata.PackageNotFoundError:
    jax = None
paths = sysconfig.get_paths()
print(json.dumps({"site": sorted({paths["purelib"], paths["platlib"]}), "jax": jax,
                  "python": "%d.%d" % sys.version_info[:2]}))
"""


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


def site_of(python: str) -> dict | None:
    """{"site": [folders], "jax": version, "python": "3.11"} of an environment's interpreter, or None."""
    try:
        done = subprocess.run([python, "-c", _SITE_PY], capture_output=True, text=True, timeout=60,
                              check=False)
        return json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def bootstrap_base(version: str, node: str) -> tuple[dict | None, str]:
    """bootstrap's environment as a setup's of Python `version` can see it ({"site", "jax", "stamp"}), or
    None and why it cannot."""
    python = os.path.join(HOME, BOOTSTRAP_ENV, "bin", "python")
    if not os.access(python, os.X_OK):
        return None, f"there is none (`tpu-console bootstrap {node}` makes it)"
    found = site_of(python)
    if found is None:
        return None, f"~/{BOOTSTRAP_ENV}/bin/python does not run"
    minor = ".".join(version.split(".")[:2])
    if found["python"] != minor:
        return None, f"it is Python {found['python']} and this environment Python {minor}"
    try:
        with open(os.path.join(HOME, BOOTSTRAP_ENV, BOOTSTRAP_STAMP)) as f:
            found["stamp"] = f.read().strip() or None
    except OSError:
        found["stamp"] = None
    return found, ""


def make_env(env: str, python: str, base: dict | None) -> bool:
    """A venv with pip in it (commands such as `pip install -r` expect one): `python -m venv`, which needs
    no network; else uv (Ubuntu's python3 lacks ensurepip without python3-venv), which fetches pip. With
    `base`, a .pth file adds bootstrap's site folders after its own (site.addsitedir, so the .pth files
    there count too: a local pod's bootstrap links the console's packages through one)."""
    attempts = [[python, "-m", "venv", env]]
    if uv := find_uv():
        attempts.append([uv, "venv", "-q", "--seed", "--python", python, env])
    said: list[str] = []
    for command in attempts:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode == 0 and os.access(os.path.join(env, "bin", "pip"), os.X_OK):
            own = site_of(os.path.join(env, "bin", "python"))
            if base is None:
                return True
            if own is not None:
                line = "import site; " + "; ".join(f"site.addsitedir({p!r})" for p in base["site"])
                with open(os.path.join(own["site"][0], BASE_PTH), "w") as f:
                    f.write(line + "\n")
                return True
            said = ["its python does not run"]
        else:
            said = (done.stderr or done.stdout).strip().splitlines() or said
        shutil.rmtree(env, ignore_errors=True)  # never leave a half-made environment to be taken for one
    say("error", f"making the environment failed: {said[-1] if said else 'no pip in it'}; install "
        "python3-venv on the worker")
    return False


def holds_project(env: str) -> bool:
    """Whether the command installed a synced project into `env` (editable or not): a distribution's
    direct_url.json (PEP 610, which pip and uv write for a local folder), an .egg-link or a .pth naming a
    folder under ~/tpu-console/projects/."""
    projects = {os.path.join(HOME, PROJECTS), os.path.realpath(os.path.join(HOME, PROJECTS))}
    for site in (site_of(os.path.join(env, "bin", "python")) or {}).get("site", []):
        try:
            entries = list(os.scandir(site))
        except OSError:
            continue
        for entry in entries:
            if entry.name.endswith(".dist-info"):
                path = os.path.join(entry.path, "direct_url.json")
            elif entry.name.endswith((".pth", ".egg-link")) and entry.name != BASE_PTH:
                path = entry.path
            else:
                continue
            try:
                with open(path, errors="replace") as f:
                    text = urllib.parse.unquote(f.read())
            except OSError:
                continue
            if any(folder + "/" in text or text.rstrip().endswith(folder) for folder in projects):
                return True
    return False


def runs_using(env_relative: str) -> list[str]:
    """The runs alive on this worker whose job works in this environment (launch.json's env_dir)."""
    runs = os.path.join(HOME, ROOT, "runs")
    alive = []
    for run_id in sorted(os.listdir(runs)) if os.path.isdir(runs) else []:
        folder = os.path.join(runs, run_id)
        job = (read_json(f"{ROOT}/runs/{run_id}/launch.json") or {}).get("job") or {}
        if job.get("env_dir") != env_relative or os.path.exists(os.path.join(folder, "exit")):
            continue
        try:
            with open(os.path.join(folder, "pid")) as f:
                os.killpg(int(f.read().strip()), 0)
        except (OSError, ValueError):
            continue  # no pid, or the process group is gone
        alive.append(run_id)
    return alive


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
    python = pick_python((read_json(f"{ROOT}/python.json") or {}).get("python"), args.python_version)
    if python is None:
        wanted = args.python_version or "3.11"
        say("error", f"no Python {wanted} on this worker; `tpu-console bootstrap {args.node} "
            f"--python-version {wanted}` gets one")
        return NO_PYTHON
    version = python_version(python) or "?"
    base, unseen = bootstrap_base(version, args.node)
    requirements = {r: file_digest(os.path.join(folder, r)) for r in named}
    # home-relative: the same digest on every worker of a pod (a local pod's workers have homes apart)
    bootstrap = {"site": [os.path.relpath(p, HOME) if p.startswith(HOME + "/") else p for p in base["site"]],
                 "stamp": base["stamp"]} if base else None
    key = json.dumps({"command": args.command, "requirements": requirements, "python": version,
                      "bootstrap": bootstrap}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    env_relative = f"{ROOT}/envs/{digest}"
    env = os.path.join(HOME, env_relative)
    synced = project.get("digest")
    record = {"digest": digest, "env": env_relative, "command": args.command, "requirements": requirements,
              "project_digest": synced, "python": version, "sees_bootstrap": base is not None,
              "holds_project": False}

    stamp = read_json(f"{env_relative}/{STAMP}") if os.path.isfile(os.path.join(env, STAMP)) else None
    if stamp is not None:
        installed = stamp.get("project_digest")
        if not stamp.get("holds_project") or installed == synced:
            record["holds_project"] = bool(stamp.get("holds_project"))
            record["finished_at"] = stamp.get("finished_at")
            say("setup", write_json(f"{ROOT}/setup.json", record))
            say("ready", "already")
            return 0
        # The environment holds the project of an earlier sync: its command again installs this one.
        if live := runs_using(env_relative):
            say("error", f"run {live[0]} still runs in ~/{env_relative}, which holds the project "
                f"{str(installed)[:16]}; stop it first (`tpu-console stop {args.node} {live[0]}`), then run "
                "setup again")
            return ENV_IN_USE
        say("step", f"~/{env_relative} holds the project {str(installed)[:16]}; running the command again "
            f"for {str(synced)[:16]}")
    elif not os.access(os.path.join(env, "bin", "pip"), os.X_OK):
        say("step", f"creating ~/{env_relative} (Python {version})")
        os.makedirs(os.path.dirname(env), exist_ok=True)
        if not make_env(env, python, base):
            return NO_ENV
        if base is not None:
            say("step", f"~/{env_relative} sees bootstrap's packages (~/{BOOTSTRAP_ENV}, jax "
                f"{base.get('jax') or 'not installed'}) after its own; the command adds to them")
        else:
            say("step", f"~/{env_relative} does not see bootstrap's packages: {unseen}; the command must "
                "install everything the job imports, jax included (jax[tpu] on a TPU VM)")
    say("step", f"running `{args.command}` in ~/{project['dir']}")
    status = run_command(args.command, folder, env)
    if status != 0:
        return status
    record["holds_project"] = holds_project(env)
    record["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    write_json(f"{env_relative}/{STAMP}", record)
    say("setup", write_json(f"{ROOT}/setup.json", record))
    say("ready", "installed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
