"""The Python 3.10 that plays a TPU VM image's python3 in the tests (Ubuntu 22.04's, on the v4, v5e and v5p
images), found on this machine: pyenv's versions, `python3.10` on the PATH or in the usual folders, and
uv's managed Pythons. Each candidate is run, so a pyenv shim that is not enabled, or a broken link, is
passed over; the answer is the interpreter's own executable, which runs from a link in any folder.

`python tests/python310.py` prints its path (scripts/_bootstrap.sh asks this way), or says what to install
and exits 1.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

INSTALL = ("install a Python 3.10: `pyenv install 3.10`, `uv python install 3.10`, "
           "or `apt-get install python3.10` on Ubuntu 22.04")
_ASK = "import platform, sys; print(platform.python_version()); print(sys.executable)"


class Python310(NamedTuple):
    path: Path  # the interpreter itself (no shim, no link)
    version: str  # "3.10.13"


def _candidates() -> list[str]:
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = [str(p) for p in sorted(pyenv.glob("3.10.*/bin/python3.10"), key=_version_key, reverse=True)]
    on_path = shutil.which("python3.10")
    found += [p for p in (on_path, "/usr/bin/python3.10", "/usr/local/bin/python3.10") if p]
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if os.access(uv, os.X_OK):
        try:
            done = subprocess.run([uv, "python", "find", "--no-project", "--managed-python", "3.10"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        if done is not None and done.returncode == 0 and done.stdout.strip():
            found.append(done.stdout.strip())
    return found


def _version_key(path: Path) -> tuple[int, ...]:
    name = path.parent.parent.name  # ~/.pyenv/versions/3.10.13/bin/python3.10
    return tuple(int(p) if p.isdigit() else -1 for p in name.split("."))


def _ask(candidate: str) -> Python310 | None:
    try:
        done = subprocess.run([candidate, "-c", _ASK], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2 or not lines[0].startswith("3.10."):
        return None
    return Python310(Path(os.path.realpath(lines[1])), lines[0])


@functools.cache
def find_python310() -> Python310 | None:
    """The first Python 3.10 found that runs, or None."""
    for candidate in dict.fromkeys(_candidates()):  # in order, each once
        found = _ask(candidate)
        if found is not None:
            return found
    return None


if __name__ == "__main__":
    found = find_python310()
    if found is None:
        print(f"no Python 3.10 found (pyenv's versions, python3.10 on the PATH, uv's Pythons): {INSTALL}",
              file=sys.stderr)
        sys.exit(1)
    print(found.path)
