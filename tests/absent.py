"""What a test does when something it needs from this machine is absent (a Python 3.10, py-spy, ptrace, sshd).

Elsewhere it skips, naming the thing and how to get it; under CI=true (`.ci/run`) it fails, so a CI run never
passes by skipping the tests that need it: `scripts/test` provides each of them on a Debian machine run as
root (scripts/_bootstrap.sh), or says what to install before any test runs.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

# What lets py-spy read a process of the same user that is not its child, as `stacks` does (Yama's
# ptrace_scope 1 allows children only, 2 only CAP_SYS_PTRACE; scripts/_bootstrap.sh checks before the tests).
PTRACE_FIX = (
    "run as root with CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE), or sysctl kernel.yama.ptrace_scope=0"
)


def strict() -> bool:
    return os.environ.get("CI") == "true"


def absent(what: str, fix: str) -> NoReturn:
    """Skip the test, saying `what` is absent and `fix`; under CI=true fail it with the same words."""
    if strict():
        pytest.fail(f"{what} (CI=true runs this test: {fix})", pytrace=False)
    pytest.skip(f"{what} ({fix})")
