"""Settings: `$TPU_CONSOLE_HOME/config.toml`, then `TPU_CONSOLE_*` environment variables, then flags.
Later sources win. Unknown keys are rejected with the key's name, so a typo never passes silently.

Environment variables use `__` for nesting: `TPU_CONSOLE_GCP__PROJECT=my-proj`. The gcp endpoint also has
the documented short form `TPU_CONSOLE_GCP_API_ENDPOINT`.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from tpu_console import locations
from tpu_console.errors import UserError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SshNodeSettings(_Strict):
    """A node made elsewhere, reached over plain SSH (`[[ssh.nodes]]`)."""

    name: str
    hosts: list[str] = Field(min_length=1)  # "host" or "host:port", one per worker, worker 0 first
    user: str = "root"
    key: str = "~/.ssh/id_ed25519"
    known_hosts: str = "~/.ssh/known_hosts"
    accept_new: bool = False  # trust-on-first-use for hosts missing from known_hosts
    devices_per_worker: int = Field(default=1, ge=1)
    accelerator_type: str | None = None


class SshSettings(_Strict):
    nodes: list[SshNodeSettings] = Field(default_factory=list)

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, nodes: list[SshNodeSettings]) -> list[SshNodeSettings]:
        seen: set[str] = set()
        for node in nodes:
            if node.name in seen:
                raise ValueError(f"two [[ssh.nodes]] are named {node.name!r}; give each a unique name")
            seen.add(node.name)
        return nodes


class GcpSettings(_Strict):
    project: str | None = None
    zones: list[str] = Field(default_factory=list)
    api_endpoint: str | None = None  # e.g. "http://127.0.0.1:8470" for an emulator
    compute_api_endpoint: str | None = None  # Compute Engine's (controller start --gce), or an emulator
    internal_ip: bool = False
    ssh_user: str = "root"
    oslogin_user: str | None = None  # your Google account email; set it to log in through OS Login
    bucket: str | None = None  # "gs://BUCKET[/PATH]" or "file:///FOLDER": where supervisors keep run records
    team_project: str | None = None  # the team's project: nodes made are labelled tpu-console-project=NAME

    @field_validator("bucket")
    @classmethod
    def _bucket_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"gs://[^/\s]+(/\S*)?|file:///\S*", value.strip()):
            raise ValueError("the bucket is gs://BUCKET[/PATH], or file:///FOLDER for a folder standing in")
        return value


class LocalSettings(_Strict):
    enabled: bool = True


class WorkersSettings(_Strict):
    """What `bootstrap` gives every worker (`[workers]`)."""

    # The Python the workers' environments are made from: this minor version or newer (JAX needs 3.11+).
    python: str = Field("3.11", pattern=r"^3\.\d{2}$")
    # Where `uv python install` downloads CPython from when the image has no such Python (a closed
    # network's mirror of python-build-standalone's releases); passed to uv as UV_PYTHON_INSTALL_MIRROR.
    python_install_mirror: str | None = None

    @field_validator("python")
    @classmethod
    def _new_enough(cls, value: str) -> str:
        if int(value.split(".")[1]) < 11:
            raise ValueError("the workers need Python 3.11 or later (JAX does); use e.g. \"3.12\"")
        return value


class NotifySettings(_Strict):
    # Slack-compatible incoming webhook (a JSON body with `text`). A secret: masked like .env values, sent
    # to the run's supervisor as a 0600 file, never on a command line.
    webhook_url: SecretStr | None = None
    desktop: bool = False  # notify-send (Linux) or osascript (macOS) here, for what the console sees

    @field_validator("webhook_url")
    @classmethod
    def _http_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("http://", "https://")):
            raise ValueError("the webhook URL must start with https:// (or http://)")
        return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TPU_CONSOLE_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    default_provider: str | None = None  # None: "gcp" when a project is configured, else "local"
    # A READY node with no run for this long is flagged idle (tpu-console idle, the app), with its cost.
    idle_after_minutes: int = Field(60, ge=1)
    local: LocalSettings = Field(default_factory=LocalSettings)
    gcp: GcpSettings = Field(default_factory=GcpSettings)
    ssh: SshSettings = Field(default_factory=SshSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    workers: WorkersSettings = Field(default_factory=WorkersSettings)
    # The terminal app's keys, by binding id: [keys] "nodes.create" = "n" (ids listed in the README).
    keys: dict[str, str] = Field(default_factory=dict)


def _read_config_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not valid TOML ({exc}); fix the file or move it aside") from None


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _env_overrides() -> dict[str, Any]:
    """Short, documented environment names that do not follow the nested `__` pattern."""
    overrides: dict[str, Any] = {}
    if endpoint := os.environ.get("TPU_CONSOLE_GCP_API_ENDPOINT"):
        overrides.setdefault("gcp", {})["api_endpoint"] = endpoint
    project = os.environ.get("CLOUDSDK_CORE_PROJECT") or os.environ.get("GOOGLE_CLOUD_PROJECT")
    if project:
        overrides.setdefault("gcp", {})["project"] = project
    return overrides


def load_settings(flags: dict[str, Any] | None = None, config_path: Path | None = None) -> Settings:
    """Build the settings from the config file, the environment, and flags (later wins).

    `flags` is a nested dict such as `{"gcp": {"zones": ["us-east5-b"]}}`; None values are ignored.
    """
    path = config_path or locations.config_file()
    file_values = _read_config_file(path)
    flag_values = _drop_none(flags or {})
    try:
        env_values = EnvSettingsSource(Settings)()  # only what TPU_CONSOLE_* variables set
        merged = _deep_merge(_deep_merge(_deep_merge(file_values, _env_overrides()), env_values), flag_values)
        return Settings.model_validate(merged)
    except ValidationError as exc:
        raise UserError(_describe_validation_error(exc, path)) from None


def _drop_none(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in values.items() if v is not None}


def _describe_validation_error(exc: ValidationError, path: Path) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    if first["type"] == "extra_forbidden":
        return (f"unknown setting {where!r} in {path} or TPU_CONSOLE_* environment; "
                "remove it or fix its spelling")
    return f"setting {where!r}: {first['msg']}; fix it in {path} or the TPU_CONSOLE_* environment"
