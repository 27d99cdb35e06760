"""scripts/_bootstrap.sh's ensure_apt_packages and ensure_test_tools: under CI=true a Debian package that the
OpenSSH, tmux or browser tests need and that cannot be had, a missing Python 3.10, a python-build-standalone
CPython that cannot be fetched, or a py-spy that is missing or cannot attach, is an error naming it and what
to install; elsewhere it is a note and those tests skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.python310 import INSTALL

BOOTSTRAP = Path(__file__).resolve().parents[1] / "scripts" / "_bootstrap.sh"


def ensure_packages(ci: str | None, missing: str) -> subprocess.CompletedProcess[str]:
    """Source the script, pretend `missing` is absent and that we are not root (so nothing is installed)."""
    script = (
        f"source {BOOTSTRAP}; set +e\n"
        f"missing_apt_packages() {{ printf '%s\\n' {missing}; }}\n"
        "id() { echo 1000; }\n"
        "ensure_apt_packages; echo \"returned $?\"\n"
    )
    env = {"PATH": "/usr/bin:/bin"} | ({"CI": ci} if ci is not None else {})
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30)


@pytest.mark.parametrize("ci", [None, "false"])
def test_a_missing_package_outside_ci_is_a_note(ci: str | None) -> None:
    result = ensure_packages(ci, "tmux chromium")
    assert result.stdout.strip() == "returned 0"
    assert result.stderr.startswith("note: tmux chromium not installed (not root")


def test_a_missing_package_under_ci_is_an_error() -> None:
    result = ensure_packages("true", "openssh-server tmux")
    assert result.returncode == 1 and "returned" not in result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: openssh-server tmux missing (not root")
    assert "apt-get install openssh-server tmux" in lines[0]


def test_nothing_missing_is_silent_under_ci() -> None:
    result = ensure_packages("true", "")
    assert result.stdout.strip() == "returned 0" and result.stderr == ""


def test_ci_run_is_strict_by_default() -> None:
    text = (BOOTSTRAP.parents[1] / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in text


def ensure_tools(
    ci: str | None, venv: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Source the script and run ensure_test_tools against the virtual environment `venv`."""
    script = f"source {BOOTSTRAP}; set +e; venv={venv}\nensure_test_tools; echo \"returned $?\"\n"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")} | (env or {})
    env |= {"CI": ci} if ci is not None else {}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)


STANDALONE = "standalone-python/cpython-3.9.13-x86_64-unknown-linux-gnu-install_only.tar.gz"


def fake_venv(tmp_path: Path, py_spy: str | None, standalone: bool = True) -> Path:
    """A venv whose python is this one and whose py-spy is `py_spy` (a shell script's body), or none; with
    `standalone`, an (empty) stand-in for the python-build-standalone tarball, so that none is fetched."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    if py_spy is not None:
        (bin_dir / "py-spy").write_text(f"#!/bin/sh\n{py_spy}\n")
        (bin_dir / "py-spy").chmod(0o755)
    if standalone:
        (bin_dir.parent / STANDALONE).parent.mkdir()
        (bin_dir.parent / STANDALONE).touch()
    return bin_dir.parent


def test_this_machine_has_the_tools_the_tests_need() -> None:
    result = ensure_tools("true", Path(sys.prefix))
    assert result.stdout.strip() == "returned 0", result.stderr
    assert "error" not in result.stderr


def test_no_python_310_under_ci_is_an_error_naming_what_to_install(tmp_path) -> None:
    venv = fake_venv(tmp_path, py_spy=f'exec {Path(sys.prefix) / "bin" / "py-spy"} "$@"')
    hidden = {"PYENV_ROOT": str(tmp_path / "no-pyenv"), "PATH": "/usr/bin:/bin"}  # no uv, no pyenv
    if Path("/usr/bin/python3.10").exists():
        pytest.skip("this machine's /usr/bin/python3.10 cannot be hidden by PATH")
    result = ensure_tools("true", venv, hidden)
    assert result.returncode == 1 and "returned" not in result.stdout
    assert result.stderr.splitlines() == [
        "error: no Python 3.10 found (pyenv's versions, python3.10 on the PATH, uv's Pythons): "
        f"{INSTALL}; CI=true runs the tests that need it"
    ]
    assert "pyenv install 3.10" in INSTALL and "uv python install 3.10" in INSTALL
    noted = ensure_tools(None, venv, hidden)
    assert noted.stdout.strip() == "returned 0"
    assert noted.stderr.startswith("note: no Python 3.10 found") and "will be skipped" in noted.stderr


@pytest.mark.parametrize("py_spy", [None, "echo 'Permission denied (os error 13)' >&2; exit 1"])
def test_a_py_spy_missing_or_refused_under_ci_is_an_error(tmp_path, py_spy: str | None) -> None:
    result = ensure_tools("true", fake_venv(tmp_path, py_spy))
    assert result.returncode == 1 and "returned" not in result.stdout
    [line] = result.stderr.splitlines()
    if py_spy is None:
        assert line.startswith("error: no py-spy in .venv (pip install py-spy)")
    else:
        assert line.startswith("error: py-spy cannot read a Python process here (kernel.yama.ptrace_scope: ")
        assert "CAP_SYS_PTRACE" in line and "sysctl kernel.yama.ptrace_scope=0" in line


def test_no_standalone_python_and_no_npm_under_ci_is_an_error(tmp_path) -> None:
    venv = fake_venv(tmp_path, py_spy=f'exec {Path(sys.prefix) / "bin" / "py-spy"} "$@"', standalone=False)
    tools = tmp_path / "tools"  # this machine's commands but npm
    tools.mkdir()
    for folder in ("/usr/bin", "/bin"):
        for entry in os.scandir(folder):
            if entry.name not in ("npm", "npx") and not (tools / entry.name).exists():
                (tools / entry.name).symlink_to(entry.path)
    result = ensure_tools("true", venv, {"PATH": f"{Path(sys.executable).parent}:{tools}"})
    assert result.returncode == 1 and "returned" not in result.stdout
    assert result.stderr.splitlines() == [
        "error: no python-build-standalone CPython in .venv and no npm to fetch it (apt-get install npm); "
        "CI=true runs the tests that need it"
    ]
    assert not (venv / STANDALONE).exists()
