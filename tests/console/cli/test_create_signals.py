"""A waiting `create` stopped by SIGTERM or SIGHUP (a CI job cancelled, a terminal closed) deletes its queued
request as Ctrl-C does, without asking: nobody is there to answer."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from tests.console.cli.test_queued import gcp_cli, run  # noqa: F401 - fixtures
from tests.fixtures_gcp import ZONES, emulator, gcp_home  # noqa: F401 - fixtures
from tpu_console.cli import prompts

Z1 = ZONES[0]


def signal_once_waiting(
    emulator, signum: signal.Signals, *, then: signal.Signals | None = None
) -> threading.Thread:
    def watch() -> None:
        for _ in range(500):
            body = emulator.queued_json(Z1, "grpo")
            if body and body["state"]["state"] == "WAITING_FOR_RESOURCES":
                os.kill(os.getpid(), signum)
                if then is not None:  # a second signal during the clean-up must not cut it short
                    time.sleep(0.01)
                    os.kill(os.getpid(), then)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_waiting_deletes_the_request_without_asking(capsys, gcp_cli, monkeypatch, signum):
    gcp_cli.stockout(Z1)
    monkeypatch.setattr(prompts, "can_ask", lambda *_a, **_k: True)  # a terminal, but nobody to answer
    monkeypatch.setattr("builtins.input", lambda question: pytest.fail(f"asked: {question}"))
    watcher = signal_once_waiting(gcp_cli, signum, then=signum)
    status, _, err = run(capsys, "create", "grpo", "--type", "v6e-8", "--zones", Z1)
    watcher.join()
    assert status == 128 + signum
    assert gcp_cli.queued_json(Z1, "grpo") is None
    assert f"{signum.name} received" in err
    assert f"{Z1}: queued request grpo deleted, confirmed gone" in err
    assert err.rstrip().endswith("cancelled: no queued request left behind")
    # the handler is gone with the create: the default action is back
    assert signal.getsignal(signum) == signal.SIG_DFL


def test_sigterm_json_reports_the_cancelled_request(capsys, gcp_cli):
    gcp_cli.stockout(Z1)
    watcher = signal_once_waiting(gcp_cli, signal.SIGTERM)
    status, out, _ = run(capsys, "create", "grpo", "--type", "v6e-8", "--zones", Z1, "--json")
    watcher.join()
    assert status == 143
    assert json.loads(out) == {"interrupted": True, "requests": [f"{Z1}/grpo"], "cancelled": True}
