"""How to reach one worker over SSH. Providers produce these; the fleet layer consumes them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SshTarget:
    worker: int  # the worker's index within its node
    host: str
    port: int
    username: str
    client_key: Path  # the private key the console authenticates with
    # Host-key trust: pinned public keys (OpenSSH one-line format) when the provider knows them
    # (local pods, gcp guest attributes); otherwise an OpenSSH known_hosts file.
    host_keys: tuple[str, ...] = ()
    known_hosts_file: Path | None = None
    accept_new: bool = False  # with known_hosts_file: trust and record a host that is not listed yet

    @property
    def address(self) -> str:
        return f"{self.username}@{self.host}:{self.port}"
