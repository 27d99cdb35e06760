"""What the app takes from the settings (config.toml, TPU_CONSOLE_*), as cli.py hands it over."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import SecretStr


@dataclass(frozen=True)
class ConsoleOptions:
    """Where `c` creates, which zones it offers, when a node is idle, and the `.env` that `s` uploads."""

    default_provider: str = "local"
    zones: list[str] = field(default_factory=list)
    gcp_project: str | None = None  # whose capacity record orders the zones when the form says `auto`
    idle_after: timedelta = timedelta(minutes=60)
    sync_env_file: str | None = None
    webhook_url: SecretStr | None = None  # [notify]: handed to each run's supervisor (a secret)
    desktop_notify: bool = False
