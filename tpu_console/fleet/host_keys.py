"""Host-key trust for one worker: a pinned key, or an OpenSSH known_hosts file with optional
trust-on-first-use. A key that differs from the one on record is always refused, never replaced."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import asyncssh

from tpu_console.domain import SshTarget

# Appends to one known_hosts file from several connections at once must not interleave.
_record_lock = threading.Lock()


def known_hosts_pattern(host: str, port: int) -> str:
    """How OpenSSH writes a host in known_hosts: bare on port 22, `[host]:port` otherwise."""
    return host if port == 22 else f"[{host}]:{port}"


class HostKeyCheck:
    """Gives asyncssh the keys to trust and decides about a key it does not know.

    asyncssh calls `validate` only for a key outside the trusted set; `refusal` then says why the
    key was refused, in words a person can act on.
    """

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        self.refusal: str | None = None

    def known_hosts_arg(self) -> object:
        if self.target.host_keys:
            return ([asyncssh.import_public_key(line) for line in self.target.host_keys], [], [])
        path = self.target.known_hosts_file
        if path is not None and path.exists():
            return asyncssh.read_known_hosts(str(path))
        return ([], [], [])  # nothing on record: every key goes through validate()

    def validate(self, host: str, port: int, key: asyncssh.SSHKey) -> bool:
        target = self.target
        where = f"worker {target.worker} ({target.host}:{target.port})"
        if target.host_keys:
            self.refusal = (
                f"host key changed: {where} presented a key that is not the one pinned for it; refusing to "
                "connect (if the worker was re-created, refresh the node; otherwise suspect an impostor)"
            )
            return False
        path = target.known_hosts_file
        pattern = known_hosts_pattern(target.host, target.port)
        recorded = self._recorded_keys(path) if path is not None else []
        if key in recorded:
            return True  # recorded since this connection read the file (another worker at this address)
        if recorded:
            self.refusal = (
                f"host key changed: {where} presented a key that differs from the one recorded for {pattern} "
                f"in {path}; refusing to connect (if the change is expected, remove the old entry with "
                f"`ssh-keygen -R '{pattern}' -f {path}`)"
            )
            return False
        if target.accept_new and path is not None:
            _record(path, pattern, key)
            return True
        self.refusal = (
            f"host key unknown: {pattern} is not in {path or 'any known_hosts file'}; add it (e.g. "
            "`ssh-keyscan "
            f"-p {target.port} {target.host} >> {path or '~/.ssh/known_hosts'}`) or set accept_new = true"
        )
        return False

    def _recorded_keys(self, path: Path) -> list[asyncssh.SSHKey]:
        if not path.exists():
            return []
        known = asyncssh.read_known_hosts(str(path))
        trusted, ca_keys, *_ = known.match(self.target.host, "", self.target.port)
        return list(trusted) + list(ca_keys)


def _record(path: Path, pattern: str, key: asyncssh.SSHKey) -> None:
    key_text = " ".join(key.export_public_key().decode().split()[:2])  # type and base64, no comment
    line = f"{pattern} {key_text}"
    with _record_lock:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = path.read_text() if path.exists() else ""
        if line in existing.splitlines():
            return  # several workers behind one address: record it once
        if existing and not existing.endswith("\n"):
            line = "\n" + line
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as out:
            out.write(line + "\n")
