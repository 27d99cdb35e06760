"""What a TPU API failure means for the person creating a node: which kind it is, and whether another
zone may do better.

Failures arrive two ways: at once, as an HTTP error from the call (`GoogleAPICallError`), or later, as
the `error` (a google.rpc.Status) of a finished long-running operation; stockouts usually come the
second way. Both are classified by status and message, since RESOURCE_EXHAUSTED covers both "no
capacity" and "quota exceeded", and a missing reservation arrives as NOT_FOUND.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import requests
from google.api_core import exceptions as api_exceptions

from tpu_console.errors import AlreadyExists, UserError

# What a TPU API call can raise besides bugs: the service's answers and the network's failures.
API_ERRORS = (api_exceptions.GoogleAPICallError, requests.RequestException, ConnectionError, TimeoutError)


class FailureKind(enum.StrEnum):
    CAPACITY = "no capacity"
    RESERVATION = "reservation not found"
    QUOTA = "quota exceeded"
    PERMISSION = "permission denied"
    INVALID = "invalid argument"
    EXISTS = "already exists"
    NOT_FOUND = "not found"
    CONFLICT = "conflict"  # another operation is changing the node; retry
    UNAUTHENTICATED = "not authenticated"
    TRANSIENT = "service unavailable"
    OTHER = "error"

    @property
    def tries_next_zone(self) -> bool:
        """Only a zone's lack of capacity (or of a reservation) is worth trying elsewhere; the rest would
        fail the same way in every zone."""
        return self in (FailureKind.CAPACITY, FailureKind.RESERVATION)


@dataclass(frozen=True)
class ApiFailure:
    kind: FailureKind
    status: str  # google.rpc code name, e.g. "RESOURCE_EXHAUSTED"
    message: str  # the service's own message, one line

    def describe(self) -> str:
        return f"{self.kind}: {self.message}"

    def fix(self) -> str:
        """What to do about it, for the one-line error a person sees."""
        return _FIXES.get(self.kind, "")


_FIXES = {
    FailureKind.CAPACITY: "try other zones (--zones), on-demand or spot, or retry later",
    FailureKind.RESERVATION: "try other zones, or create with a reservation you hold",
    FailureKind.QUOTA: "request more TPU quota for this zone (IAM & Admin > Quotas), or delete idle nodes; "
    "preempted spot nodes still count until deleted",
    FailureKind.PERMISSION: "grant your account roles/tpu.admin on the project, and enable the TPU API "
    "(gcloud services enable tpu.googleapis.com)",
    FailureKind.INVALID: "check the accelerator type, runtime version and labels",
    FailureKind.EXISTS: "pick another name, or delete the existing node first",
    FailureKind.UNAUTHENTICATED: "run `gcloud auth application-default login`",
    FailureKind.TRANSIENT: "the TPU API is having trouble; retry in a minute",
}

# google.rpc.Code numbers, for operation errors (which carry the number, not the name).
_CODE_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
    6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
    15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}
_HTTP_STATUS_NAMES = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ABORTED", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}

_CAPACITY = re.compile(r"capacity|stockout|stock.out|resources? (are|is) not available|"
                       r"does not have enough resources|ZONE_RESOURCE_POOL_EXHAUSTED", re.IGNORECASE)
_QUOTA = re.compile(r"quota", re.IGNORECASE)
_RESERVATION = re.compile(r"reservation", re.IGNORECASE)


def classify(status: str, message: str) -> ApiFailure:
    message = " ".join(message.split())  # one line
    if _RESERVATION.search(message) and re.search(
        r"not found|does not exist|no reservation", message, re.IGNORECASE
    ):
        kind = FailureKind.RESERVATION
    elif _QUOTA.search(message):
        kind = FailureKind.QUOTA  # before capacity: quota messages can say "resource exhausted" too
    elif _CAPACITY.search(message) or status == "RESOURCE_EXHAUSTED":
        kind = FailureKind.CAPACITY
    else:
        kind = {
            "PERMISSION_DENIED": FailureKind.PERMISSION,
            "INVALID_ARGUMENT": FailureKind.INVALID,
            "FAILED_PRECONDITION": FailureKind.INVALID,
            "OUT_OF_RANGE": FailureKind.INVALID,
            "ALREADY_EXISTS": FailureKind.EXISTS,
            "NOT_FOUND": FailureKind.NOT_FOUND,
            "ABORTED": FailureKind.CONFLICT,
            "UNAUTHENTICATED": FailureKind.UNAUTHENTICATED,
            "UNAVAILABLE": FailureKind.TRANSIENT,
            "INTERNAL": FailureKind.TRANSIENT,
            "DEADLINE_EXCEEDED": FailureKind.TRANSIENT,
        }.get(status, FailureKind.OTHER)
    return ApiFailure(kind, status, message)


def classify_exception(exc: BaseException) -> ApiFailure:
    """Classify an error raised by a client call."""
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        status, message = _status_and_message(exc)
        return classify(status, message)
    return classify("UNAVAILABLE" if _is_network_error(exc) else "UNKNOWN", str(exc) or type(exc).__name__)


def classify_operation_error(code: int, message: str) -> ApiFailure:
    """Classify the `error` of a finished long-running operation."""
    return classify(_CODE_NAMES.get(code, "UNKNOWN"), message)


def _status_and_message(exc) -> tuple[str, str]:
    """The google.rpc status name and the bare message, from the HTTP error body when there is one.

    The exception's own message starts with "METHOD URL:", which is noise for a person; and HTTP 409 is
    both ABORTED and ALREADY_EXISTS, which only the body's `status` tells apart.
    """
    status = _HTTP_STATUS_NAMES.get(exc.code or 0, "UNKNOWN")
    message = exc.message or ""
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            error = response.json().get("error", {})
        except ValueError:
            error = {}
        if isinstance(error, dict):
            status = error.get("status") or status
            message = error.get("message") or message
    return status, message


def _is_network_error(exc: BaseException) -> bool:
    return isinstance(exc, requests.ConnectionError | requests.Timeout | ConnectionError | TimeoutError)


def stop_unless_next_zone(failure: ApiFailure, name: str, zone: str) -> None:
    """A create that failed in `zone`: go on to the next zone only for lack of capacity or of a
    reservation; anything else stops the create here."""
    if failure.kind.tries_next_zone:
        return
    fix = f"; {failure.fix()}" if failure.fix() else ""
    error = AlreadyExists if failure.kind is FailureKind.EXISTS else UserError
    raise error(f"create {name} in {zone}: {failure.describe()}{fix}")
