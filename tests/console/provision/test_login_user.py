"""bootstrap as a TPU VM image's login user, over OpenSSH: not root, with passwordless sudo.

The worker is this machine reached through a stock sshd as `sudo_user` (tests/fixtures_sshd.py), with the
PATH sshd gives such a user. Its python3 is Debian's, and, as on the Ubuntu images, without `venv`: the
test takes python3.X-venv away (root, dpkg) so that bootstrap must add it back the way it does on an
image, `sudo -n apt-get install`, from Debian's archive. What it installs is one small wheel made here
(pip with no index), not the trainer's set, which other tests install: what is tested is the login.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.absent import absent
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.fixtures_sshd import LoginUser, running_sshd
from tpu_console import cli
from tpu_console.provision import bootstrap
from tpu_console.ssh_identity import client_key_path

IMAGE_PYTHON = Path("/usr/bin/python3")
APT = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-o", "DPkg::Lock::Timeout=300", "-qq"]


def installed(package: str) -> bool:
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Status}", package], capture_output=True, text=True)
    return done.stdout.endswith(" installed")


@pytest.fixture
def image_python_without_venv() -> Iterator[str]:
    """Debian's python3 with its venv packages removed; they are put back after, whatever happened."""
    if not IMAGE_PYTHON.exists() or shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        absent("no Debian python3 and apt-get here", "Debian: apt-get install python3")
    minor = subprocess.run([str(IMAGE_PYTHON), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    removed = [p for p in ("python3-venv", f"python{minor}-venv") if installed(p)]
    policy = subprocess.run(["apt-cache", "policy", f"python{minor}-venv"], capture_output=True, text=True)
    if "Candidate: (none)" in policy.stdout or not policy.stdout:  # no package lists yet
        subprocess.run([*APT, "update"], check=True, capture_output=True)
    if removed:
        subprocess.run(["dpkg", "-r", *removed], check=True, capture_output=True)
    try:
        yield minor
    finally:
        lacking = [p for p in removed if not installed(p)]
        if lacking:
            subprocess.run([*APT, "install", "-y", *lacking], check=True, capture_output=True)


def probe_wheel(folder: Path) -> Path:
    """A one-module wheel, `login_probe`, that pip installs with no index."""
    wheel = folder / "login_probe-1.0-py3-none-any.whl"
    files = {
        "login_probe.py": "LOGGED_IN = True\n",
        "login_probe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: login-probe\nVersion: 1.0\n",
        "login_probe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "login_probe-1.0.dist-info/RECORD"
    files[record] = "".join(f"{name},,\n" for name in [*files, record])
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


@pytest.mark.timeout(300)
def test_bootstrap_as_a_login_user_with_sudo_installs_venv_through_sudo(
    capsys, tmp_path, monkeypatch, console_home, sudo_user: LoginUser, image_python_without_venv  # noqa: F811
):
    minor = image_python_without_venv
    # The wheel where the login user can read it (tmp_path is under root's private folder).
    shared = Path(tempfile.mkdtemp(prefix="tpu-console-login-"))
    shared.chmod(0o755)
    try:
        wheel = probe_wheel(shared)
        monkeypatch.setattr(bootstrap, "trainer_requirements", lambda flavour: [str(wheel)])
        # No index: the venv's pip fails at once to fetch uv and installs the wheel alone.
        for sshd in running_sshd(tmp_path, {"PIP_NO_INDEX": "1"}, login_home=True):
            known_hosts = tmp_path / "known_hosts"
            known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
            (console_home / "config.toml").write_text(
                f'[[ssh.nodes]]\nname = "login"\nhosts = ["127.0.0.1:{sshd.port}"]\n'
                f'user = "{sudo_user.name}"\nkey = "{client_key_path()}"\nknown_hosts = "{known_hosts}"\n'
            )
            looks = "id -un; python3 -c 'import ensurepip' 2>/dev/null || echo no-venv"
            assert cli.main(["exec", "login", "--", looks]) == 0
            assert capsys.readouterr().out.splitlines() == [f"[0] {sudo_user.name}", "[0] no-venv"]

            status = cli.main(["bootstrap", "login", "--no-link", "--json"])
            out, err = capsys.readouterr()
            assert status == 0, out[-3000:] + err[-3000:]
            assert f"installing python{minor}-venv with apt-get" in err
            assert installed(f"python{minor}-venv")  # put back by the login user's sudo

            root = sudo_user.home / "tpu-console"
            recorded = json.loads((root / "python.json").read_text())
            assert recorded["source"] == "image" and recorded["python"] == str(IMAGE_PYTHON)
            assert (root / "env").stat().st_uid == (root / "python.json").stat().st_uid != 0
            assert cli.main(["exec", "login", "--", "~/tpu-console/env/bin/python -c "
                             "'import login_probe, os; print(login_probe.LOGGED_IN, os.getuid() != 0)'"]) == 0
            assert capsys.readouterr().out.splitlines() == ["[0] True True"]
    finally:
        shutil.rmtree(shared)
