"""scripts/_bootstrap.sh's ensure_apt_packages: under CI=true a Debian package that the OpenSSH, tmux or
browser tests need and that cannot be had is an error naming it; elsewhere it is a note and they skip."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
