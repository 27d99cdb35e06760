"""Errors a person can meet. Each carries a one-line message that names the problem and the fix."""

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input or an unmet precondition. The CLI prints `error: <message>` and exits with status 2.

    Raised before any remote side effect, so nothing has changed when a person sees one.
    """

    exit_status = 2


class NotFound(UserError):
    """An unknown node, type or worker."""


class UnknownNode(NotFound):
    """A node name no provider has; `close` are the names of existing nodes it may be a typo of."""

    def __init__(self, name: str, close: list[str]) -> None:
        super().__init__(f"unknown node {name!r}{did_you_mean(close)}: `tpu-console ls` lists the nodes")
        self.name = name
        self.close = close


def close_names(name: str, names: Iterable[str]) -> list[str]:
    """The names `name` may be a typo of, the closest first, equally close ones by name (at most 3)."""
    scored = [(difflib.SequenceMatcher(None, name, other).ratio(), other) for other in set(names)]
    return [other for score, other in sorted(scored, key=lambda s: (-s[0], s[1])) if score >= 0.6][:3]


def did_you_mean(close: list[str]) -> str:
    """` (did you mean 'pod'?)`, ` (did you mean 'pod' or 'pod-2'?)`, or nothing."""
    if not close:
        return ""
    quoted = [repr(name) for name in close]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f" (did you mean {listed}?)"


class AlreadyExists(UserError):
    """A node name that is taken."""


class Unreachable(Exception):
    """A worker that could not be connected to (network, auth or host key)."""


def one_line(exc: BaseException) -> str:
    """An exception as one line for a person: its first line, or its type when it has no message."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


class CreateInterrupted(Exception):
    """A create was interrupted (Ctrl-C, esc) while queued requests were out: the caller asks whether to
    cancel them, so none is left behind silently. `requests` are the provider's names for them."""

    def __init__(self, provider: str, requests: list[str]) -> None:
        super().__init__(f"create interrupted with queued request(s) {', '.join(requests)} still out")
        self.provider = provider
        self.requests = requests
