"""`tpu-console serve` in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright with
`executable_path`, since no browser can be downloaded) loads the page, the app's screen streams in over its
websocket, and keys pressed in the page create a local pod from the `c` form. What the browser receives is
read from the websocket frames it gets (xterm.js draws on a canvas, so the page has no text to query); the
screenshot is of the page as drawn. `scripts/test` installs both (apt `chromium`, the dev extra)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.console.tui.test_serve import free_port
from tests.fixtures_cli import console_home  # noqa: F401 - fixture

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test installs it)"),
]


class Frames:
    """Everything the page received on the app's websocket, as text."""

    def __init__(self) -> None:
        self.received: list[str] = []

    def take(self, frame: str | bytes) -> None:
        self.received.append(frame if isinstance(frame, str) else frame.decode("utf-8", "replace"))

    def text(self) -> str:
        return "".join(self.received)


def until(page, condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the browser never got {what}")
        page.wait_for_timeout(100)


@pytest.mark.timeout(180)
def test_the_app_in_headless_chromium_creates_a_local_node(tmp_path, console_home):  # noqa: F811
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "tpu_console", "serve", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    frames = Frames()
    shot = tmp_path / "browser.png"
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 700})
            page.on("websocket", lambda ws: ws.on("framereceived", frames.take))
            for _ in range(100):  # the server takes a moment to listen
                try:
                    page.goto(f"http://127.0.0.1:{port}/")
                    break
                except sync_api.Error:
                    time.sleep(0.2)
            until(page, lambda: "WHERE" in frames.text(), "the nodes table")
            until(page, lambda: "no nodes: press c to create one" in frames.text(), "the empty listing")
            page.click("#terminal")
            page.keyboard.press("c")
            until(page, lambda: "Create a node" in frames.text(), "the create form")
            page.keyboard.type("web")  # the name (its default, selected, is typed over); the type as offered
            page.keyboard.press("Enter")
            until(page, lambda: "web is READY" in frames.text(), "the created node")
            page.wait_for_timeout(300)
            page.screenshot(path=str(shot))
            browser.close()
        assert shot.stat().st_size > 10_000 and shot.read_bytes().startswith(b"\x89PNG")
        assert (console_home / "local" / "web").is_dir()  # made for real, by the app the browser drove
    finally:
        server.terminate()
        server.wait(10)
    deleted = subprocess.run([sys.executable, "-m", "tpu_console", "delete", "web", "--yes"],
                             capture_output=True, text=True, env=dict(os.environ))
    assert deleted.returncode == 0, deleted.stderr
