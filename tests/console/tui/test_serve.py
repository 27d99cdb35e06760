"""`tpu-console serve`: the app served over HTTP by textual-serve, loaded as a browser would load it."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture


async def _first_screen(port: int, timeout: float = 30.0) -> bytes:
    import aiohttp  # textual-serve's own dependency

    received = b""
    async with aiohttp.ClientSession() as session, session.ws_connect(f"ws://127.0.0.1:{port}/ws") as ws:
        await ws.send_json(["resize", {"width": 100, "height": 30}])
        deadline = time.monotonic() + timeout
        while b"WHERE" not in received and time.monotonic() < deadline:
            try:
                message = await asyncio.wait_for(ws.receive(), 5)
            except TimeoutError:
                continue
            if message.type == aiohttp.WSMsgType.BINARY:
                received += message.data
            elif message.type == aiohttp.WSMsgType.TEXT:
                received += message.data.encode()
            else:
                break
    return received


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.usefixtures("console_home")
def test_serve_answers_with_the_app_page():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tpu_console", "serve", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        page = None
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as answer:
                    page = answer.read().decode()
                    break
            except OSError:
                time.sleep(0.1)
        assert page is not None, server.stdout.read1().decode() if server.stdout else ""
        assert "tpu-console" in page and f"ws://127.0.0.1:{port}/ws" in page  # the terminal's websocket
        # A browser tab then opens the websocket: the server starts the app, whose screen streams back.
        screen = asyncio.run(_first_screen(port))
        assert b"WHERE" in screen  # the nodes table's header, drawn by a real app session
    finally:
        server.terminate()
        server.wait(10)
