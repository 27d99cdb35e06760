"""Pilot tests of the managed-runs screen (`M`): what the controller's store holds (the folder standing for
the bucket in this console's home), the acting controller, a run's incarnations and recoveries, and a
cancel that the store records for the controller's next pass."""

from __future__ import annotations

import time

import pytest
from textual.widgets import DataTable, Static

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.controller import state as st
from tpu_console.controller.state import Incarnation, ManagedRun, Recovery
from tpu_console.controller.store import open_store
from tpu_console.settings import load_settings
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.screens.managed_screen import ManagedScreen

pytestmark = pytest.mark.usefixtures("console_home")


def managed_run(run_id: str, status: str = "RUNNING", hours_ago: float = 1.0) -> ManagedRun:
    t = time.time() - 3600 * hours_ago
    return ManagedRun(
        id=run_id, provider="local", node="spot-a", accelerator_type="local-2x1", job={"kind": "command"},
        status=status, created=t,
        incarnations=[
            Incarnation(1, "spot-a", zone="us-east5-b", created_at=t, run_id="20261128-000000-aaaa",
                        started_at=t + 60, ended_at=t + 1200, ended="preempted", last_step=40),
            Incarnation(2, "spot-a-2", zone="us-east5-a", created_at=t + 1300, run_id="20261128-002000-bbbb",
                        started_at=t + 1400, resumed_step=38),
        ],
        recoveries=[Recovery(2, "preempted", detected_at=t + 1200, confirmed_at=t + 1206, deleted_at=t + 1230,
                             created_at=t + 1300, prepared_at=t + 1390, first_step_at=t + 1420,
                             last_step_before=40, resumed_step=38)],
    )


async def until(pilot, condition, what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def open_managed(pilot) -> ManagedScreen:
    await pilot.press("M")
    screen = pilot.app.screen
    assert isinstance(screen, ManagedScreen)
    await until(pilot, lambda: screen.listings >= 1, "the store read")
    return screen


def app() -> TpuConsoleApp:
    return TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)


async def test_m_shows_each_managed_run_its_incarnations_and_recoveries_and_x_cancels_it():
    store = open_store(load_settings())
    st.add(store, managed_run("m20261128-000000-abcd"))
    st.add(store, managed_run("m20261127-000000-0000", status="SUCCEEDED", hours_ago=24))
    async with app().run_test(size=(120, 40)) as pilot:
        screen = await open_managed(pilot)
        table = screen.query_one("#managed", DataTable)
        assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == [
            "m20261128-000000-abcd", "m20261127-000000-0000"]  # newest first
        assert "none (start one with `tpu-console controller start`)" in str(
            screen.query_one("#controller", Static).render())
        shown = str(screen.query_one("#incarnations", Static).render())
        assert "spot-a-2" in shown and "us-east5-a" in shown and "preempted" in shown
        assert "recovery 2 (preempted): 220 s to the first new step, 2 step(s) lost" in shown

        await pilot.press("x")
        assert isinstance(pilot.app.screen, ConfirmModal)
        await pilot.press("n")  # asked, declined: nothing written
        assert not st.load(store, "m20261128-000000-abcd").run.stop_requested
        await pilot.press("x", "y")
        await until(pilot, lambda: st.load(store, "m20261128-000000-abcd").run.stop_requested, "the cancel")

        await pilot.press("down", "x")  # an ended run is not asked about
        assert isinstance(pilot.app.screen, ManagedScreen)
        await pilot.press("escape")
        assert not isinstance(pilot.app.screen, ManagedScreen)


async def test_m_with_no_managed_run_says_how_to_hand_one_over():
    async with app().run_test(size=(120, 40)) as pilot:
        screen = await open_managed(pilot)
        assert "launch NODE --managed" in str(screen.query_one("#status", Static).render())
