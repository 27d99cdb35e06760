"""Notifications from the console (observe/notifications.py): the webhook only for what the pod cannot send
(a node idle or preempted), the desktop for everything, and the webhook URL nowhere in what is printed."""

from __future__ import annotations

import socket

from pydantic import SecretStr

from tests.console.observe.test_supervision import WEBHOOK_SECRET_PATH, Webhook
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console import cli
from tpu_console.observe.notifications import Notifier
from tpu_console.secrets import SecretMasker


def test_the_webhook_gets_what_only_the_console_sees_and_the_desktop_everything(tmp_path, monkeypatch):
    hook = Webhook()
    shown = tmp_path / "shown"
    fake = tmp_path / "bin" / "notify-send"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$2" >> {shown}\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    try:
        notifier = Notifier(SecretStr(hook.url), desktop=True)
        notifier.notify("idle", "pod-a (v6e-8) idle for 2h, ~$21.60 so far")
        notifier.notify("failed", "run r1 on pod-a failed")  # the pod's supervisor sends this one
        notifier.notify("preempted", "pod-a: the node is PREEMPTED during run r1: recreating it")
        assert hook.events() == ["idle", "preempted"] and "pod-a (v6e-8) idle" in hook.messages[0]["text"]
        assert shown.read_text().splitlines() == ["pod-a (v6e-8) idle for 2h, ~$21.60 so far",
                                                  "run r1 on pod-a failed",
                                                  "pod-a: the node is PREEMPTED during run r1: recreating it"]
    finally:
        hook.server.shutdown()


def test_a_webhook_that_fails_is_reported_without_its_url():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}{WEBHOOK_SECRET_PATH}"
    said: list[str] = []
    Notifier(SecretStr(url), problem=said.append).notify("preempted", "pod-a: the node is PREEMPTED")
    assert said == ["the preempted notification did not reach the webhook (URLError)"]


def test_the_webhook_url_is_a_secret_in_settings_and_maskers(capsys, console_home):  # noqa: F811
    console_home.mkdir(parents=True, exist_ok=True)
    config = console_home / "config.toml"
    config.write_text(f'[notify]\nwebhook_url = "ftp://hooks.example{WEBHOOK_SECRET_PATH}"\n')
    assert cli.main(["ls"]) == 2
    err = capsys.readouterr().err
    assert "setting 'notify.webhook_url'" in err and "https://" in err and WEBHOOK_SECRET_PATH not in err
    url = f"https://hooks.example{WEBHOOK_SECRET_PATH}"
    config.write_text(f'[notify]\nwebhook_url = "{url}"\n')
    assert SecretMasker.for_node("any").mask(f"posting to {url}") == "posting to ***"
