"""Who launched a run, and whether that is this console's person: launch.json's `launched_by`
({user, host, home}) and the marks the same person's nodes carry (providers/gcp/labels.py).

`user` is the login name (getpass: $LOGNAME, $USER ...), `host` this machine's name, `home` an id made
once per console home (`console-id` in it), so two homes of one person are told apart when that matters,
and a run is "mine" whenever its user is this console's user."""

from __future__ import annotations

import secrets
import socket
from typing import Any

from tpu_console import locations, ssh_identity

ID_FILE = "console-id"


def current_user() -> str:
    return ssh_identity.user_name() or "unknown"


def home_id() -> str:
    """This console home's id: 8 hex characters, made on first use."""
    path = locations.home() / ID_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        text = ""
    if not text:
        text = secrets.token_hex(4)
        path.write_text(text + "\n")
    return text


def me() -> dict[str, str]:
    """launch.json's `launched_by` for a run launched from here."""
    return {"user": current_user(), "host": socket.gethostname(), "home": home_id()}


def is_this_home(mark: dict[str, Any]) -> bool:
    """Whether a record's `host` and `home` (an owner, a lease's holder) are this console home's (a record
    without a home: its host decides, as every one did before homes were kept)."""
    return mark.get("host") == socket.gethostname() and mark.get("home") in (None, home_id())


def owner(launched_by: dict[str, Any] | None) -> str | None:
    """The user a run or lock names; None when it names none (a run from before launched_by existed)."""
    user = (launched_by or {}).get("user")
    return str(user) if user else None


def is_mine(launched_by: dict[str, Any] | None) -> bool:
    """A run is this person's when it says so, or says nothing (then it was launched from this home or
    before anyone recorded who)."""
    user = owner(launched_by)
    return user is None or user == current_user()


def describe(launched_by: dict[str, Any] | None) -> str:
    """`alice on laptop-7`, for messages."""
    user = owner(launched_by) or "someone"
    host = (launched_by or {}).get("host")
    return f"{user} on {host}" if host else user


def new_token() -> str:
    """An id for one launch's hold on a node's lock (launch/lock.py)."""
    return secrets.token_hex(8)
