"""The real dashboard on a new user's job that fails on a local pod (tests/console/launch/new_user_job.py):
`e` names the same first failure as `status`, and `enter` on a worker shows its error whole, the
traceback's frames and all, not only its last line."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.console.launch.new_user_job import launch_new_user_job
from tests.console.launch.test_launch_command import follow
from tests.console.launch.test_local import pod, run  # noqa: F401 - fixture
from tests.console.tui.test_run_local import wait_until
from tests.console.tui.test_run_screen import DashboardApp
from tests.fixtures_cli import NOW, console_home  # noqa: F401 - fixture
from tpu_console.history.store import RunStore
from tpu_console.providers.registry import build_providers, close_providers
from tpu_console.settings import load_settings
from tpu_console.tui.modals.full_text import FullTextModal
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.screens.run_screen import RunScreen

pytestmark = pytest.mark.usefixtures("console_home", "pod")


def test_enter_shows_the_workers_traceback_whole_and_e_the_first_failure_status_names(capsys, tmp_path):
    run_id = launch_new_user_job(capsys, tmp_path, 3, "0=1.0", "1=0")
    status, _ = follow(capsys, run_id)
    assert status == 1
    status, out, _ = run(capsys, "status", run_id, "--json")
    failure = json.loads(out)["failure"]
    assert failure.startswith("worker 1 exited 1")
    asyncio.run(dashboard(run_id, failure))  # the CLI runs its own event loop: the app gets one after it


async def dashboard(run_id: str, failure: str) -> None:
    providers = build_providers(load_settings())
    store = RunStore()
    feed = RunFeed(providers, run_id, store, clock=lambda: NOW, poll_s=0.2)
    app = DashboardApp(None, RunScreen(providers, run_id, store, feed=feed))
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            screen = app.run_screen
            await wait_until(pilot, lambda: screen.snapshot is not None and screen.snapshot.ended
                             and all(w.traceback for w in screen.snapshot.workers))
            assert screen.snapshot.failure == failure and screen.snapshot.first_failure == 1

            await pilot.press("1", "enter")
            assert isinstance(app.screen, FullTextModal)
            body = app.screen.body
            traceback = body[body.index("Traceback (most recent call last):"):].splitlines()
            assert traceback[-1] == "KeyError: 'y'"
            frames = [line.strip() for line in traceback if line.strip().startswith("File ")]
            assert [frame.rsplit(" ", 1)[-1] for frame in frames] == ["<module>", "main", "lookup"]
            assert 'return config[key]' in body
            await pilot.press("escape")

            await pilot.press("e")
            assert isinstance(app.screen, FullTextModal)
            assert app.screen.body.startswith(failure)
            assert "worker 1's traceback:\nTraceback (most recent call last):" in app.screen.body
    finally:
        await close_providers(providers)
