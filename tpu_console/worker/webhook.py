"""The run's webhook notifications, sent by its supervisor (supervisor.py) with the console gone: one
Slack-compatible message per event (a JSON body with `text`, and `event`, `run_id` and `node` beside it),
each delivery, or its failure, one of the supervisor's decisions.

The URL is a secret: it comes in the run folder's `.notify` (0600, uploaded by `launch` only when a
webhook is set up), never on a command line, and a failure says what failed, never where to.

Python 3.8+ and the standard library only: shipped into the run folder beside supervisor.py.
"""

import json
import os
import threading
import urllib.request

NOTIFY_FILE = ".notify"


def read_url(folder):
    """The webhook URL in the run folder's `.notify`; None without one."""
    path = os.path.join(folder, NOTIFY_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f).get("webhook_url")


class Webhook:
    """Messages about run `run_id` on `node` to `url`; `decide(decision, message, **fields)` records each
    delivery."""

    def __init__(self, url, run_id, node, decide):
        self.url = url
        self.run_id = run_id
        self.node = node
        self.decide = decide

    def send(self, event, text, wait=False):
        """One message, from a thread of its own unless `wait`: a slow webhook must not hold up the
        runners' reports."""
        if not wait:
            threading.Thread(target=self.send, args=(event, text, True)).start()
            return
        body = {"text": f"tpu-console: run {self.run_id} on {self.node}: {text}", "event": event,
                "run_id": self.run_id, "node": self.node}
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
            self.decide("notified", f"sent the {event} notification", event=event)
        except (OSError, ValueError) as exc:
            self.decide("notify-failed", f"the {event} notification was not delivered "
                        f"({type(exc).__name__})", event=event)
