"""The marks a console puts on the nodes and queued requests it makes (GCP labels), and reading them
back: who made a node. A node made elsewhere (gcloud, another tool) carries none, is listed all the same,
and `tpu-console adopt NODE` adds them.

GCP label rules: keys start with a lowercase letter; keys and values hold lowercase letters, digits,
`_` and `-`, at most 63 characters."""

from __future__ import annotations

import re

from tpu_console import ssh_identity

CREATED_BY = "created-by"
CONSOLE = "tpu-console"
USER = "tpu-console-user"
PROJECT = "tpu-console-project"
_NOT_ALLOWED = re.compile(r"[^a-z0-9_-]+")


def sanitise(value: str) -> str:
    """`Alice.Smith@Example` -> `alice-smith-example`: a valid label value (possibly empty)."""
    return _NOT_ALLOWED.sub("-", value.strip().lower()).strip("-")[:63]


def console_marks(user: str | None = None, project: str | None = None) -> dict[str, str]:
    """The labels of a node this console makes: made by tpu-console, by this user, for the project."""
    marks = {CREATED_BY: CONSOLE}
    if who := sanitise(ssh_identity.user_name() if user is None else user):
        marks[USER] = who
    if project and (name := sanitise(project)):
        marks[PROJECT] = name
    return marks


def owner(labels: dict[str, str]) -> str | None:
    """The user a node's labels name; None for a node made elsewhere (or before the labels existed)."""
    return labels.get(USER) or None


def made_here(labels: dict[str, str]) -> bool:
    return labels.get(CREATED_BY) == CONSOLE
