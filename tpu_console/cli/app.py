"""The terminal app, in this terminal (`tpu-console` with no verb) or in a browser tab
(`tpu-console serve`)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from tpu_console.providers.registry import build_providers, create_provider_name
from tpu_console.settings import Settings


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    serve = verbs.add_parser(
        "serve", parents=[common], help="the terminal app in a browser tab (textual-serve)",
        description="Serve the terminal app over HTTP: each browser tab gets its own tpu-console session.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8566, help="port (default 8566)")


def open_app(settings: Settings) -> int:
    from datetime import timedelta

    from tpu_console.tui.app import TpuConsoleApp
    from tpu_console.tui.keymap import check_keymap
    from tpu_console.tui.options import ConsoleOptions

    options = ConsoleOptions(
        default_provider=create_provider_name(settings), zones=list(settings.gcp.zones),
        gcp_project=settings.gcp.project, idle_after=timedelta(minutes=settings.idle_after_minutes),
        sync_env_file=".env" if os.path.isfile(".env") else None,
        webhook_url=settings.notify.webhook_url, desktop_notify=settings.notify.desktop,
    )
    keymap = check_keymap(settings.keys)  # before the app takes the terminal: a bad id is one line
    TpuConsoleApp(build_providers(settings), options=options, keymap=keymap).run()
    return 0


def serve(args: argparse.Namespace) -> int:
    """The same app in a browser tab: textual-serve runs `tpu-console` per browser session."""
    from textual_serve.server import Server

    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "tpu_console"])
    print(f"serving tpu-console at http://{args.host}:{args.port} (Ctrl-C stops)",
          file=sys.stderr, flush=True)
    Server(command, host=args.host, port=args.port, title="tpu-console").serve()
    return 0
