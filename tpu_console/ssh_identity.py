"""The console's own SSH identity: one ed25519 key pair, created on first use under TPU_CONSOLE_HOME/keys.

Every provider authenticates with this key (local pods trust it, gcp nodes get it in `ssh-keys` metadata),
so a researcher never has to hand tpu-console a personal key.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

import asyncssh

from tpu_console import locations

KEY_NAME = "console_ed25519"


def client_key_path() -> Path:
    """Path of the private key, creating the pair if it does not exist yet."""
    path = locations.keys_dir() / KEY_NAME
    if not path.exists():
        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"tpu-console@{_user()}")
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(key.export_private_key())
        os.chmod(tmp, 0o600)
        tmp.replace(path)  # atomic, so a concurrent console never reads half a key
        path.with_suffix(".pub").write_bytes(key.export_public_key())
    return path


def public_key_line() -> str:
    """The public key in OpenSSH one-line format, e.g. `ssh-ed25519 AAAA... tpu-console@me`."""
    client_key_path()
    return (locations.keys_dir() / f"{KEY_NAME}.pub").read_text().strip()


def _user() -> str:
    return user_name() or "user"


def user_name() -> str:
    """The person at this console: the login name ($LOGNAME, $USER ...); "" where none is known. Runs
    and nodes are marked with it (history/ownership.py, providers/gcp/labels.py)."""
    try:
        return getpass.getuser()
    except OSError:
        return ""
