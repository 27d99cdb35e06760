"""Notifications from this machine: desktop notifications, and the webhook for what only the console sees.

`[notify]` in config.toml: `webhook_url` (Slack-compatible: a JSON body with `text`) and `desktop`. The run's
supervisor on the pod sends the run's own notifications (succeeded, failed, hung, restarted, node deleted:
worker/supervisor.py), so they arrive with the laptop closed and arrive once: the console does not send
those to the webhook again. What only the console can see goes to the webhook from here: a node preempted
(the pod, and its supervisor, are gone) and a node idle past `idle_after_minutes`. Desktop notifications
are for whoever sits at this machine: every event the console sees while it runs.

The webhook URL is a secret: it is never printed, logged, or put in an exception (a failed delivery says
what failed, not where to).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable

from pydantic import SecretStr

# The events the supervisor sends to the webhook itself; the console sends them to the desktop only.
POD_SIDE = ("succeeded", "failed", "hung", "restarted", "deleted")


class Notifier:
    def __init__(self, webhook_url: SecretStr | None = None, desktop: bool = False,
                 problem: Callable[[str], None] = lambda _line: None) -> None:
        self._webhook = webhook_url
        self.desktop = desktop
        self.problem = problem  # told, in one line without the URL, when a delivery fails

    @classmethod
    def from_settings(cls, settings, problem: Callable[[str], None] = lambda _line: None) -> Notifier:
        return cls(settings.notify.webhook_url, settings.notify.desktop, problem)

    def notify(self, event: str, text: str) -> None:
        """One notification: to the desktop when enabled, and to the webhook unless the pod sends it."""
        if self.desktop:
            self._desktop(text)
        if self._webhook is not None and event not in POD_SIDE:
            self._post(event, text)

    def _post(self, event: str, text: str) -> None:
        body = json.dumps({"text": f"tpu-console: {text}", "event": event}).encode()
        request = urllib.request.Request(self._webhook.get_secret_value(), data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except (OSError, ValueError) as exc:
            reason = exc.code if isinstance(exc, urllib.error.HTTPError) else type(exc).__name__
            self.problem(f"the {event} notification did not reach the webhook ({reason})")

    def _desktop(self, text: str) -> None:
        if platform.system() == "Darwin" and shutil.which("osascript"):
            script = f'display notification {json.dumps(text)} with title "tpu-console"'
            command = ["osascript", "-e", script]
        elif shutil.which("notify-send"):
            command = ["notify-send", "tpu-console", text]
        else:
            return  # no desktop to notify (a server, a container)
        try:
            subprocess.run(command, timeout=10, check=False, capture_output=True)
        except (OSError, subprocess.SubprocessError):
            self.problem("the desktop notification could not be shown")
