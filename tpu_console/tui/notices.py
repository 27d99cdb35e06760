"""A screen's notices (Textual's toasts), kept few and current.

Each notice is about a subject (`run`, `supervisor`, `log:oom` ...): a newer notice about the same subject
replaces the one shown instead of stacking under it, a notice whose subject has changed since is withdrawn
(`withdraw`: a hang the run's end settled, a stall that moved on), and at most `most` are shown at once,
the oldest going first. They are shown as plain text (a log line's brackets are no markup).
"""

from __future__ import annotations

from collections import OrderedDict

from textual.app import App
from textual.notifications import Notification, Notify, SeverityLevel

MOST_SHOWN = 3
# How long each kind stays, in seconds, unless withdrawn first.
TIMEOUTS: dict[SeverityLevel, float] = {"information": 6.0, "warning": 10.0, "error": 15.0}


class Notices:
    def __init__(self, app: App, most: int = MOST_SHOWN) -> None:
        self.app = app
        self.most = most
        self._shown: OrderedDict[str, Notification] = OrderedDict()  # subject -> its notice, oldest first

    def show(self, subject: str, message: str, *, title: str = "", severity: SeverityLevel = "information",
             timeout: float | None = None) -> None:
        """Show `message` about `subject`, in place of the notice about it already shown."""
        self.withdraw(subject)
        notification = Notification(message, title, severity, timeout or TIMEOUTS[severity], markup=False)
        self._shown[subject] = notification
        self.app.post_message(Notify(notification))
        for old in [s for s, n in self._shown.items() if n.has_expired]:
            del self._shown[old]
        while len(self._shown) > self.most:
            self.withdraw(next(iter(self._shown)))

    def withdraw(self, subject: str) -> None:
        """Take down the notice about `subject`, if one is shown: what it said no longer holds."""
        notification = self._shown.pop(subject, None)
        if notification is not None:
            notification.timeout = 0.0  # expired: not shown even if its Notify is still on its way
            # Textual takes a toast down through App._unnotify only (what a toast itself calls when its
            # time is up); there is no public call for one notice.
            self.app._unnotify(notification)

    def withdraw_all(self) -> None:
        for subject in list(self._shown):
            self.withdraw(subject)

    @property
    def shown(self) -> dict[str, str]:
        """subject -> message of the notices still up (for tests and help)."""
        return {s: n.message for s, n in self._shown.items() if not n.has_expired}
