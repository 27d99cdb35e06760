"""`a` (every worker, interleaved) on a run opened after its lines were written: the workers' lines in the
order they were written (the job runner's output.times on each worker), not one worker's block and then
the other's. Two workers of a local pod print a line every 1.2 s, worker 1 0.6 s after worker 0."""

from __future__ import annotations

import asyncio

import pytest

from tests.console.launch.new_user_job import launch_in_project
from tests.console.launch.test_launch_command import follow
from tests.console.launch.test_local import pod, run_folder  # noqa: F401 - fixture
from tests.console.tui.test_run_local import wait_until
from tests.console.tui.test_run_screen import DashboardApp
from tests.fixtures_cli import NOW, console_home  # noqa: F401 - fixture
from tpu_console.history.store import RunStore
from tpu_console.providers.registry import build_providers, close_providers
from tpu_console.settings import load_settings
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.screens.run_screen import RunScreen
from tpu_console.tui.widgets.log_pane import LogPane

pytestmark = pytest.mark.usefixtures("console_home", "pod")

LINES = 5
TICK_PY = f"""\
import os, time
worker = int(os.environ["TPU_CONSOLE_WORKER"])
time.sleep(0.6 * worker)
for i in range({LINES}):
    print(f"w{{worker}} line {{i}}", flush=True)
    time.sleep(1.2)
"""


def test_every_worker_interleaved_is_in_the_order_the_lines_were_written(capsys, tmp_path):
    run_id = launch_in_project(capsys, tmp_path, {"tick.py": TICK_PY}, ["tick.py"])
    status, lines = follow(capsys, run_id)
    assert status == 0 and lines[0] == [f"w0 line {i}" for i in range(LINES)], lines
    marks = (run_folder(1, run_id) / "output.times").read_text().splitlines()
    assert len(marks) >= LINES  # the runner noted when the log grew, a line at a time here
    shown = asyncio.run(interleaved(run_id))
    assert shown == [f"[{w}]  w{w} line {i}" for i in range(LINES) for w in (0, 1)], shown


async def interleaved(run_id: str) -> list[str]:
    providers = build_providers(load_settings())
    store = RunStore()
    feed = RunFeed(providers, run_id, store, clock=lambda: NOW, poll_s=0.2)
    app = DashboardApp(None, RunScreen(providers, run_id, store, feed=feed))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            screen = app.run_screen
            await pilot.press("a")
            pane = screen.query_one(LogPane)

            def ticks() -> list[str]:
                return [text for text in pane.visible_text() if " line " in text]

            await wait_until(pilot, lambda: len(ticks()) == 2 * LINES)
            return ticks()
    finally:
        await close_providers(providers)
