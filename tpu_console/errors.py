"""Errors a person can meet. Each carries a one-line message that names the problem and the fix."""


class UserError(Exception):
    """Bad input or an unmet precondition. The CLI prints `error: <message>` and exits with status 2.

    Raised before any remote side effect, so nothing has changed when a person sees one.
    """

    exit_status = 2


class NotFound(UserError):
    """An unknown node, type or worker."""


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
