"""Pilot tests for the first screen: background refresh, `r`, `?` and `q`."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from textual.widgets import DataTable, Static

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.domain import NodeState
from tpu_console.locations import config_file
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.help import HelpScreen
from tpu_console.tui.screens.nodes_screen import NodesScreen

pytestmark = pytest.mark.usefixtures("console_home")


def make_app(provider: FakeProvider, refresh_every: float = 3600.0) -> TpuConsoleApp:
    return TpuConsoleApp({"fake": provider}, refresh_every=refresh_every, clock=lambda: NOW)


async def wait_for_refreshes(pilot, screen: NodesScreen, count: int) -> None:
    for _ in range(200):
        if screen.refreshes >= count:
            return
        await pilot.pause(0.01)
    raise AssertionError(f"only {screen.refreshes} refreshes happened, expected {count}")


def cells(table: DataTable) -> list[list[str]]:
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


async def test_table_lists_every_node_with_ls_columns():
    provider = FakeProvider(
        [
            replace(
                make_node("pod-b", "local", state=NodeState.PREEMPTED, zone=None),
                health="UNHEALTHY_MAINTENANCE",
            ),
            replace(make_node("pod-a", "gcp", spot=False), health="HEALTHY"),
        ]
    )
    app = make_app(provider)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, NodesScreen)
        await wait_for_refreshes(pilot, screen, 1)
        table = screen.query_one("#nodes", DataTable)
        assert [str(c.label) for c in table.columns.values()] == [
            "NAME",
            "WHERE",
            "TYPE",
            "W",
            "STATE",
            "AGE",
            "$/HOUR",
            "RUN",
        ]
        assert cells(table) == [
            ["pod-a", "us-east5-b", "v6e-16", "4", "READY ok", "3h12m", "~$43.20", "IDLE 3h12m ~$138"],
            ["pod-b", "local", "v6e-16", "4", "PREEMPTED maint", "3h12m", "spot", "-"],
        ]
        assert "2 nodes · updated 12:00:00 · ~$43.20/h · 1 idle" in str(
            screen.query_one("#status", Static).render()
        )


async def test_r_refreshes_and_shows_new_nodes():
    provider = FakeProvider([make_node("pod-a")])
    app = make_app(provider)
    async with app.run_test() as pilot:
        screen = app.screen
        await wait_for_refreshes(pilot, screen, 1)
        assert provider.list_calls == 1
        provider.nodes["pod-c"] = make_node("pod-c", age=timedelta(seconds=5))
        await pilot.press("r")
        await wait_for_refreshes(pilot, screen, 2)
        assert provider.list_calls == 2
        assert [row[0] for row in cells(screen.query_one("#nodes", DataTable))] == ["pod-a", "pod-c"]


async def test_background_refresh_runs_on_its_own():
    provider = FakeProvider([make_node("pod-a")])
    app = make_app(provider, refresh_every=0.05)
    async with app.run_test() as pilot:
        await wait_for_refreshes(pilot, app.screen, 3)
        assert provider.list_calls >= 3


async def test_cursor_stays_on_the_same_node_across_refreshes():
    provider = FakeProvider([make_node("pod-a"), make_node("pod-b")])
    app = make_app(provider)
    async with app.run_test() as pilot:
        screen = app.screen
        await wait_for_refreshes(pilot, screen, 1)
        await pilot.press("down")
        provider.nodes["pod-0"] = make_node("pod-0")  # sorts first, shifting pod-b down a row
        await pilot.press("r")
        await wait_for_refreshes(pilot, screen, 2)
        table = screen.query_one("#nodes", DataTable)
        assert table.get_row_at(table.cursor_row)[0] == "pod-b"


async def test_provider_problems_show_in_status_and_notification():
    provider = FakeProvider([make_node("pod-a")], problems=["zone us-east1-d: 503 unavailable"])
    app = make_app(provider)
    async with app.run_test() as pilot:
        screen = app.screen
        await wait_for_refreshes(pilot, screen, 1)
        assert "problem: fake: zone us-east1-d" in str(screen.query_one("#status", Static).render())
        await pilot.pause()
        assert [n.message for n in app._notifications] == ["fake: zone us-east1-d: 503 unavailable"]
        assert screen.query_one("#nodes", DataTable).row_count == 1  # the listing still shows


async def test_failing_provider_does_not_crash_the_app():
    provider = FakeProvider([make_node("pod-a")])
    provider.fail_listing = RuntimeError("credentials expired")
    app = make_app(provider)
    async with app.run_test() as pilot:
        screen = app.screen
        await wait_for_refreshes(pilot, screen, 1)
        await pilot.pause()
        assert "fake: credentials expired" in [n.message for n in app._notifications]
        provider.fail_listing = None
        await pilot.press("r")
        await wait_for_refreshes(pilot, screen, 2)
        assert screen.query_one("#nodes", DataTable).row_count == 1


async def test_question_mark_opens_help_listing_the_keys_and_escape_closes_it():
    app = make_app(FakeProvider())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        lines = [
            " ".join(line.split())
            for line in str(app.screen.query_one("#help-keys", Static).render()).splitlines()
        ]
        for line in (
            "c Create create: name, type, zones; gcp: capacity, wait-for, race, direct",
            "⏎ Open the node's latest run",
            "r Refresh",
            "/ Filter",
            "esc Clear filter clear the filter; with none, offer to cancel a queued create",
            "? Help",
            "R Runs",
            "q Quit",
        ):
            assert any(shown.startswith(line) for shown in lines), (line, lines)
        await pilot.press("escape")
        assert isinstance(app.screen, NodesScreen)


async def test_keys_can_be_remapped_by_binding_id():
    provider = FakeProvider([make_node("pod-a")])
    app = TpuConsoleApp(
        {"fake": provider},
        refresh_every=3600,
        clock=lambda: NOW,
        keymap={"nodes.refresh": "f5", "app.help": "f1"},
    )
    async with app.run_test() as pilot:
        screen = app.screen
        await wait_for_refreshes(pilot, screen, 1)
        await pilot.press("r")  # no longer bound
        await pilot.pause()
        assert provider.list_calls == 1
        await pilot.press("f5")
        await wait_for_refreshes(pilot, screen, 2)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        assert "f5" in str(app.screen.query_one("#help-keys", Static).render()).lower()


async def test_q_quits():
    app = make_app(FakeProvider())
    async with app.run_test() as pilot:
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


async def test_q_in_help_closes_help_instead_of_quitting():
    app = make_app(FakeProvider())
    async with app.run_test() as pilot:
        await pilot.press("question_mark", "q")
        assert isinstance(app.screen, NodesScreen)
        assert app.is_running


def test_a_keys_entry_in_the_config_that_names_no_binding_is_refused_before_the_app_opens(capsys):
    from tpu_console.cli import main

    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text('[keys]\n"nodes.create" = "n"\n"nodes.creat" = "N"\n')
    assert main([]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "error: [keys] 'nodes.creat' is not a binding id; use one of: app.help, app.managed, app.quit")
    assert "nodes.create" in err and "\n" not in err


def test_the_keys_in_the_config_reach_the_app():
    from tpu_console.settings import load_settings
    from tpu_console.tui.keymap import check_keymap

    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text('[keys]\n"nodes.create" = "n"\n"runs.compare" = "C"\n')
    assert check_keymap(load_settings().keys) == {"nodes.create": "n", "runs.compare": "C"}
