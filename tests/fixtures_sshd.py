"""A real OpenSSH server on 127.0.0.1 for the tests that must meet stock sshd (Debian `openssh-server`).

It runs as the current user with a config of its own in a temp folder: its own host key, and the
console's public key as the only authorized key. Tests that need it skip only when sshd is not installed
(under CI=true they fail: tests/absent.py).

`sudo_user` is the login a TPU VM image gives: a user other than root with passwordless sudo. Made once
(useradd, an /etc/sudoers.d entry; it stays, as on a CI box), it needs the tests to run as root; the
console's key is authorized in its ~/.ssh for the test, and that key and its ~/tpu-console go after.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from tests.absent import absent
from tpu_console import ssh_identity

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
SFTP_SERVER_CANDIDATES = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
)


@dataclass
class Sshd:
    port: int
    host_key_line: str  # the server's public host key, OpenSSH one-line format (no comment)
    folder: Path


def _find(candidates: tuple[str, ...], name: str) -> str | None:
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, process: subprocess.Popen, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited with status {process.returncode}: {process.stderr.read()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                if sock.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on port {port} within {timeout}s")


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    yield from running_sshd(tmp_path)


SUDO_USER = "tpu-console-ci"


@dataclass
class LoginUser:
    name: str
    home: Path


@pytest.fixture
def sudo_user() -> Iterator[LoginUser]:
    if os.geteuid() != 0:
        absent("adding a login user with sudo needs root", "run the tests as root, as CI does")
    if shutil.which("sudo") is None:
        absent("sudo is not installed", "Debian: apt-get install sudo")
    if subprocess.run(["id", SUDO_USER], capture_output=True).returncode != 0:
        # "*", not useradd's locked "!": without PAM, sshd refuses a locked account even a key.
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--password", "*", SUDO_USER],
                       check=True, capture_output=True)
    sudoers = Path("/etc/sudoers.d") / SUDO_USER
    if not sudoers.exists():
        draft = sudoers.with_name(f".{SUDO_USER}.draft")  # sudo skips names with a dot
        draft.write_text(f"{SUDO_USER} ALL=(ALL) NOPASSWD:ALL\n")
        draft.chmod(0o440)
        subprocess.run(["visudo", "-cqf", str(draft)], check=True)
        draft.rename(sudoers)
    account = pwd.getpwnam(SUDO_USER)
    home = Path(account.pw_dir)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    authorized = ssh_dir / "authorized_keys"
    authorized.write_text(ssh_identity.public_key_line() + "\n")
    for path in (ssh_dir, authorized):
        os.chown(path, account.pw_uid, account.pw_gid)
    try:
        yield LoginUser(SUDO_USER, home)
    finally:
        authorized.unlink(missing_ok=True)
        shutil.rmtree(home / "tpu-console", ignore_errors=True)


def running_sshd(
    tmp_path: Path, session_env: dict[str, str] | None = None, *, login_home: bool = False
) -> Iterator[Sshd]:
    """The `sshd` fixture's server; `session_env` (PATH, say) is set in every session it starts.
    `login_home`: sessions keep the user's own HOME and its ~/.ssh/authorized_keys counts too (a login
    user other than the one running the tests, `sudo_user`); else every session gets a HOME of its own."""
    sshd_bin = _find(SSHD_CANDIDATES, "sshd")
    if sshd_bin is None:
        absent("OpenSSH sshd is not installed", "Debian: apt-get install openssh-server openssh-client")
    folder = tmp_path / "sshd"
    folder.mkdir()
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    host_key_file = folder / "ssh_host_ed25519_key"
    host_key_file.write_bytes(host_key.export_private_key())
    host_key_file.chmod(0o600)
    (folder / "authorized_keys").write_text(ssh_identity.public_key_line() + "\n")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    port = _free_port()
    # A home of its own: the sessions' bash reads this home's (empty) ~/.bashrc, not the user's, whose
    # start-up work (pyenv rehash, say) would slow every command and could be cut short by a test's kill.
    home = folder / "home"
    home.mkdir()
    sftp_server = _find(SFTP_SERVER_CANDIDATES, "sftp-server") or "internal-sftp"
    environment = ({} if login_home else {"HOME": str(home)}) | (session_env or {})
    set_env = " ".join(f"{key}={value}" for key, value in environment.items())
    config = folder / "sshd_config"
    config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {host_key_file}
PidFile none
AuthorizedKeysFile {folder}/authorized_keys{" .ssh/authorized_keys" if login_home else ""}
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp {sftp_server}
LogLevel ERROR
{f"SetEnv {set_env}" if set_env else ""}
"""
    )
    process = subprocess.Popen(
        [sshd_bin, "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_listening(port, process)
        yield Sshd(
            port=port,
            host_key_line=" ".join(host_key.export_public_key().decode().split()[:2]),
            folder=folder,
        )
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
