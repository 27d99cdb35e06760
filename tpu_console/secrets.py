"""Secrets from a `.env` file: read them for upload, and mask their values wherever worker output is shown.

A `.env` holds `KEY=value` lines (`WANDB_API_KEY=...`, `HF_TOKEN=...`). Its content travels to the workers
by SFTP only (mode 0600) and reaches the job through its environment. The console never prints it, but a
job might (a library that echoes its token, a shell `set -x`): every line of worker output the console
shows or stores goes through a `SecretMasker` built from the same file, so a value that leaks out of a
job is shown as `***` instead.

Which `.env` belongs to a node is remembered by path only (`$TPU_CONSOLE_HOME/secret_sources.json`), never
by value, so a later `logs` or the app can mask what an earlier `sync` or `launch` uploaded. The
`[notify]` webhook URL of config.toml is a secret too, masked by the same maskers.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

from tpu_console import locations
from tpu_console.errors import UserError

MASK = "***"
MAX_ENV_FILE_BYTES = 1 << 20
# Values shorter than this are not masked: masking "1" or "true" would garble every line of output.
MIN_SECRET_LENGTH = 4
_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*?)\s*$")


def parse_env(text: str) -> dict[str, str]:
    """`KEY=value` lines as bash's `set -a; . ./.env` reads the common cases: comments, `export`, quotes."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        key, value = match.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def read_env_file(env_file: str | Path) -> bytes:
    """The file's bytes, or a UserError naming the file and the fix. The content is never shown."""
    path = Path(env_file).expanduser()
    if not path.is_file():
        raise UserError(
            f"env file {path} does not exist; create it with KEY=value lines (e.g. WANDB_API_KEY=...) "
            "or leave out --env-file"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read env file {path} ({exc.strerror}); check its permissions") from None
    if len(data) > MAX_ENV_FILE_BYTES:
        raise UserError(f"env file {path} is over 1 MiB; it should hold KEY=value lines only")
    return data


class SecretMasker:
    """Replaces every occurrence of any secret value in a text with `***`. Longest values first, so a
    value that contains another is masked whole."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        unique = sorted({v for v in values if len(v) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in unique)) if unique else None

    @classmethod
    def from_env_bytes(cls, data: bytes | None) -> SecretMasker:
        if not data:
            return cls()
        return cls(parse_env(data.decode("utf-8", errors="replace")).values())

    @classmethod
    def for_node(cls, node: str, extra: Iterable[str | Path] = ()) -> SecretMasker:
        """A masker for what `sync` and `launch` uploaded to `node`, plus any `extra` env files. Files that
        are gone or unreadable are skipped: masking is a safety net, not a precondition."""
        values: list[str] = configured_secrets()
        for path in [*remembered_env_files(node), *extra]:
            try:
                data = Path(path).expanduser().read_bytes()
            except OSError:
                continue
            values.extend(parse_env(data.decode("utf-8", errors="replace")).values())
        return cls(values)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def mask(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return self._pattern.sub(MASK, text)


def configured_secrets() -> list[str]:
    """Secret values of the console's own settings: the `[notify]` webhook URL (config.toml or
    TPU_CONSOLE_NOTIFY__WEBHOOK_URL), masked wherever worker output or a run's record is shown."""
    values = []
    if url := os.environ.get("TPU_CONSOLE_NOTIFY__WEBHOOK_URL"):
        values.append(url)
    try:
        notify = tomllib.loads(locations.config_file().read_text()).get("notify", {})
    except (OSError, ValueError):
        notify = {}
    if isinstance(notify, dict) and isinstance(notify.get("webhook_url"), str):
        values.append(notify["webhook_url"])
    return values


def _sources_file() -> Path:
    return locations.home() / "secret_sources.json"


def remembered_env_files(node: str) -> list[str]:
    """The env file paths uploaded to `node` (paths only; the values stay in those files)."""
    try:
        sources = json.loads(_sources_file().read_text())
    except (OSError, ValueError):
        return []
    paths = sources.get(node, []) if isinstance(sources, dict) else []
    return [p for p in paths if isinstance(p, str)]


def remember_env_file(node: str, env_file: str | Path) -> None:
    """Note that `env_file`'s values were uploaded to `node`, so its output is masked from now on."""
    path = str(Path(env_file).expanduser().resolve())
    file = _sources_file()
    try:
        sources = json.loads(file.read_text())
        if not isinstance(sources, dict):
            sources = {}
    except (OSError, ValueError):
        sources = {}
    paths = [p for p in sources.get(node, []) if p != path] + [path]
    sources[node] = paths[-8:]
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_suffix(".tmp")
    tmp.write_text(json.dumps(sources, indent=2) + "\n")
    tmp.replace(file)
