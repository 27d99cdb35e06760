"""Run ids: `YYYYmmdd-HHMMSS-<4 hex>` in UTC, so they sort by start time and read as dates anywhere."""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime

from tpu_console.errors import UserError

_RUN_ID = re.compile(r"^(\d{8}-\d{6})-([0-9a-f]{4})$")


def new_run_id(now: datetime | None = None, suffix: str | None = None) -> str:
    """A fresh id for a run starting `now` (default: the current time); 4 random hex digits keep two
    launches in the same second apart."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    tail = suffix if suffix is not None else secrets.token_hex(2)
    run_id = f"{moment:%Y%m%d-%H%M%S}-{tail}"
    if not is_run_id(run_id):
        raise ValueError(f"bad run id suffix {tail!r}: 4 lowercase hex digits")
    return run_id


def is_run_id(text: str) -> bool:
    match = _RUN_ID.match(text)
    if not match:
        return False
    try:
        datetime.strptime(match.group(1), "%Y%m%d-%H%M%S")
    except ValueError:
        return False
    return True


def check_run_id(text: str) -> str:
    """`text` stripped, or UserError if it is not a run id (checked before it reaches a shell or a path)."""
    text = text.strip()
    if not is_run_id(text):
        raise UserError(
            f"{text!r} is not a run id (YYYYmmdd-HHMMSS-xxxx); `tpu-console runs` lists the runs"
        )
    return text


def started_at(run_id: str) -> datetime:
    """The UTC start time encoded in a run id."""
    return datetime.strptime(run_id[:15], "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
