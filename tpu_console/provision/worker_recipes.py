"""Shell recipes that make a worker able to run the trainer: the Python environment, the code, the checks
before a launch, and clearing stale TPU holders.

Like `tpu_console/fleet/run_recipes.py`, each function returns the text of one bash command built with
`shlex.quote` from data, so it can be read and tested without a worker. Everything lives under
`~/tpu-console/` on the worker:

    env/                         the trainer's virtual environment (bootstrap)
    env/.tpu-console-bootstrap   digest of what bootstrap installed: equal digest = nothing to do
    env/.tpu-console-installer   `uv PATH` or `pip`: how sync installs the code later
    code.json                    the code installed by sync: source (wheel|git), git_sha, dirty, wheel digest
    wheels/                      the uploaded wheel
    python.json                  the base interpreter bootstrap chose: python, version, source
    projects/, project.json      a project of your own, synced (project_recipes.py)
    envs/, setup.json            its setup environments (project_setup.py)

Progress lines that the console parses start with `@@ ` (see tpu_console/provision/report.py); everything
else a recipe prints is installer output, shown to the person as it comes.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from tpu_console import worker

ROOT = "tpu-console"  # relative to the worker's home
ENV_FILE = f"{ROOT}/.env"  # where sync puts the secrets; launch copies them into each run
ENV_DIR = f"{ROOT}/env"
ENV_PYTHON = f"~/{ENV_DIR}/bin/python"  # as `--python` takes it: ~ is the worker's home
CODE_FILE = f"{ROOT}/code.json"
PYTHON_FILE = f"{ROOT}/python.json"  # bootstrap's base interpreter: {"python", "version", "source"}
PROJECTS_DIR = f"{ROOT}/projects"  # projects/<digest>/: a synced project tree, never modified after unpacking
PROJECT_FILE = f"{ROOT}/project.json"  # the current project (sync --dir / --git)
ENVS_DIR = f"{ROOT}/envs"  # envs/<digest>/: a setup environment
SETUP_FILE = f"{ROOT}/setup.json"  # the current setup, written only when it succeeded
WHEELS_DIR = f"{ROOT}/wheels"
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
TPU_DEVICE_PATTERNS = ("/dev/accel*", "/dev/vfio/[0-9]*")

# Prints one `@@ versions {...}` line about an interpreter: importlib.metadata only, never `import jax`,
# which on a TPU VM would grab the TPU from a running job.
_VERSIONS_PY = r"""
import json, platform, sys
from importlib import metadata
def v(*names):
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return None
print("@@ versions " + json.dumps({"python": platform.python_version(), "jax": v("jax"),
      "jaxlib": v("jaxlib"), "libtpu": v("libtpu", "libtpu-nightly"), "flax": v("flax"), "optax": v("optax"),
      "transformers": v("transformers"), "tpu-console": v("tpu-console")}, sort_keys=True))
"""


def _home(relative: str) -> str:
    return '"$HOME"/' + shlex.quote(relative)


# A bash function every recipe that reports on the environment defines first: `@@ versions {...}` about
# $env/bin/python, then `@@ code {...}` when code.json is there.
VERSIONS_FUNCTION = (
    f'versions() {{ "$env/bin/python" -c {shlex.quote(_VERSIONS_PY)}; '
    f'if [ -s {_home(CODE_FILE)} ]; then echo "@@ code $(tr -d "\\n" < {_home(CODE_FILE)})"; fi; return 0; }}'
)


def bootstrap(
    python: str | None,
    version: str,
    requirements: Sequence[str],
    digest: str,
    *,
    exact: bool = False,
    link_site_packages: str | None = None,
    link_tools: Sequence[str] = (),
    force: bool = False,
    install_mirror: str | None = None,
) -> tuple[str, str]:
    """The command and its stdin that make `~/tpu-console/env` hold `requirements`, idempotently.

    The script (worker/bootstrap.sh) travels on stdin, its arguments on the command line
    (requirements and paths: nothing secret). A second run whose digest matches the stamp only reports
    the versions (`@@ ready already`). Otherwise it picks the base interpreter: `python` when given, else
    the image's python3 when it is `version` or newer (exactly `version` with `exact`), else a python3.1x
    already there, else one `uv python install` makes (from `install_mirror`, passed to uv as
    UV_PYTHON_INSTALL_MIRROR), and records it in python.json. Then a venv with uv when it is there or can
    be installed into the venv, else `python -m venv` and pip, then the requirements. With
    `link_site_packages` (pods that share the console's machine, such as local pods), the venv sees those
    packages through a `.pth` file instead of downloading them again per worker (and `link_tools`, their
    executables, are linked into env/bin); pip then finds every requirement already satisfied.
    """
    args = [
        python or "", version, "1" if exact else "0", digest, link_site_packages or "",
        ":".join(link_tools), "1" if force else "0", *requirements,
    ]
    script = VERSIONS_FUNCTION + "\n" + worker.source("bootstrap.sh").decode()
    mirror = f"UV_PYTHON_INSTALL_MIRROR={shlex.quote(install_mirror)} " if install_mirror else ""
    return mirror + "bash -s -- " + " ".join(shlex.quote(a) for a in args), script


def _install_command(target: str) -> str:
    """Install `target` (a wheel path or a source folder, a quoted shell word) into the env, replacing
    what was there, without dependencies (bootstrap installed those), with the installer bootstrap chose."""
    return (
        'inst=$(cat "$env/.tpu-console-installer" 2>/dev/null); '
        'case "$inst" in "uv "*) '
        f'"${{inst#uv }}" pip install -q --python "$env/bin/python" --reinstall --no-deps {target};; '
        f'*) "$env/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps '
        f"--no-build-isolation {target};; esac"
    )


def _require_env() -> str:
    return (
        f'env={_home(ENV_DIR)}; if [ ! -x "$env/bin/python" ]; then '
        'echo "@@ error no trainer environment on this worker; run `tpu-console bootstrap NODE` first"; '
        "exit 20; fi"
    )


def install_wheel(wheel_name: str, code_json: str) -> str:
    """Install the uploaded `~/tpu-console/wheels/<wheel_name>` and record `code_json` in code.json."""
    wheel = _home(f"{WHEELS_DIR}/{wheel_name}")
    return (
        f"( {_require_env()}\n{VERSIONS_FUNCTION}\n"
        'echo "@@ step installing the code"\n'
        f"{_install_command(wheel)} || exit 21\n"
        f"printf '%s\\n' {shlex.quote(code_json)} > {_home(CODE_FILE)}.tmp && "
        f"mv -f {_home(CODE_FILE)}.tmp {_home(CODE_FILE)}\n"
        'echo "@@ ready synced"; versions )'
    )


def _echo_json_file(kind: str, relative: str) -> str:
    """`@@ KIND {json}` with the file's content on one line, when the file is there."""
    return f'if [ -s {_home(relative)} ]; then echo "@@ {kind} $(tr -d "\\n" < {_home(relative)})"; fi\n'


def inspect_worker(runs_dir: str = "tpu-console/runs") -> str:
    """One round trip before a launch: is there a trainer environment, which code and library versions
    it holds, the base Python, project and setup recorded there (python.json, project.json, setup.json),
    and which runs on this worker are still alive (their process group answers `kill -0`)."""
    return (
        f"( env={_home(ENV_DIR)}\n{VERSIONS_FUNCTION}\n"
        'if [ -x "$env/bin/python" ]; then echo "@@ env present"; versions; else echo "@@ env missing"; fi\n'
        f'[ -f {_home(ROOT + "/.env")} ] && echo "@@ envfile present"\n'
        + _echo_json_file("python", PYTHON_FILE)
        + _echo_json_file("project", PROJECT_FILE)
        + _echo_json_file("setup", SETUP_FILE)
        + f'for d in {_home(runs_dir)}/*/; do [ -f "$d/pid" ] || continue; [ -e "$d/exit" ] && continue; '
        'pg=$(cat "$d/pid"); case "$pg" in ""|*[!0-9]*) continue;; esac; '
        'kill -0 -- "-$pg" 2>/dev/null && echo "@@ live $(basename "$d") $pg"; done\n'
        "exit 0 )"
    )


def kill_stale(device_patterns: Sequence[str] = TPU_DEVICE_PATTERNS, lockfile: str = LIBTPU_LOCKFILE) -> str:
    """Kill every process that holds a TPU device open (a job from an earlier, unmanaged run that would
    make the next one fail with "TPU in use") and remove libtpu's lockfile. Reads /proc directly, so it
    needs neither lsof nor fuser. Prints `@@ killed PID NAME PATH` and `@@ removed PATH` lines."""
    cases = "|".join(p.replace(" ", "\\ ") for p in device_patterns)
    return (
        "( me=$$; seen=' '\n"
        'for fd in /proc/[0-9]*/fd/*; do t=$(readlink "$fd" 2>/dev/null) || continue\n'
        f'  case "$t" in {cases}) ;; *) continue;; esac\n'
        '  pid=${fd#/proc/}; pid=${pid%%/*}; [ "$pid" = "$me" ] && continue\n'
        '  case "$seen" in *" $pid "*) continue;; esac; seen="$seen$pid "\n'
        '  name=$(cat /proc/$pid/comm 2>/dev/null); kill -KILL "$pid" 2>/dev/null && echo "@@ killed $pid '
        '$name $t"\n'
        "done\n"
        f"lock={shlex.quote(lockfile)}\n"
        'if [ -e "$lock" ]; then rm -f "$lock" && echo "@@ removed $lock"; fi\n'
        "exit 0 )"
    )
