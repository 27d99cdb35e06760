"""Pilot tests of a queued create from the app against the TPU API emulator: the form, the request's
timeline in the operations panel, esc offering to cancel it (no keeps it waiting, yes deletes it and
confirms it is gone), and a queued request without a node in the nodes table."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

from textual.widgets import Input

from tests.fixtures_cli import NOW
from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home, make_provider  # noqa: F401 - fixtures
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.modals.create_node import CreateNodeModal
from tpu_console.tui.options import ConsoleOptions
from tpu_console.tui.screens.nodes_screen import NodesScreen
from tpu_console.tui.widgets.node_table import NodeTable
from tpu_console.tui.widgets.operations_log import OperationsLog

Z1 = ZONES[0]


def gcp_app(provider) -> TpuConsoleApp:
    options = ConsoleOptions(default_provider="gcp", zones=[Z1])
    return TpuConsoleApp({"gcp": provider}, refresh_every=3600, clock=lambda: NOW, options=options)


async def until(pilot, condition, what: str) -> None:
    for _ in range(500):
        if condition():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def ops_text(screen: NodesScreen) -> str:
    return "\n".join(screen.query_one("#ops", OperationsLog).lines_written)


async def create_from_the_form(pilot, app, name: str) -> NodesScreen:
    screen = app.screen
    await until(pilot, lambda: screen.refreshes >= 1, "the first listing")
    await pilot.press("c")
    modal = app.screen
    assert isinstance(modal, CreateNodeModal)
    modal.query_one("#name", Input).value = name
    modal.query_one("#type", Input).value = "v6e-8"
    await pilot.click("#create")
    return screen


async def test_a_queued_create_from_the_form_shows_its_timeline(emulator, make_provider):
    emulator.capacity_after(Z1, 0.3)
    app = gcp_app(make_provider(zones=[Z1]))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await create_from_the_form(pilot, app, "grpo")
        await until(pilot, lambda: f"grpo is READY in {Z1}" in ops_text(screen), "the create to finish")
        text = ops_text(screen)
        assert f"create grpo: {Z1}: queuing v6e-8 (spot, v6e-ubuntu-2404)" in text
        for state in ("WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "node READY"):
            assert f"create grpo: {Z1}: {state} after " in text
        assert screen.queued_creates == {}
        await until(pilot, lambda: screen.query_one(NodeTable).row_count == 1, "the new node")
        assert str(screen.query_one(NodeTable).get_row_at(0)[0]) == "grpo ⧗"  # made by a queued request


async def test_esc_offers_to_cancel_a_waiting_create_no_keeps_it_yes_deletes_it(emulator, make_provider):
    emulator.stockout(Z1)  # it waits for capacity until cancelled
    app = gcp_app(make_provider(zones=[Z1]))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await create_from_the_form(pilot, app, "grpo")
        await until(pilot, lambda: "WAITING_FOR_RESOURCES" in ops_text(screen), "the request to wait")

        await pilot.press("escape")
        assert isinstance(app.screen, ConfirmModal)
        assert "Cancel create grpo? Its queued request is deleted" in app.screen.question
        await pilot.press("n")
        await pilot.pause(0.1)
        assert isinstance(app.screen, NodesScreen) and "create grpo" in screen.running
        assert emulator.queued_json(Z1, "grpo")["state"]["state"] == "WAITING_FOR_RESOURCES"

        await pilot.press("escape")
        await pilot.press("y")
        done = "cancelled: the queued request is deleted, confirmed gone"
        await until(pilot, lambda: done in ops_text(screen), "the cancel to finish")
        assert f"{Z1}: queued request grpo deleted, confirmed gone" in ops_text(screen)
        assert emulator.queued_json(Z1, "grpo") is None
        assert screen.running == [] and screen.queued_creates == {}


async def test_quitting_during_a_queued_create_deletes_its_request_first(emulator, make_provider):
    emulator.stockout(Z1)  # it waits for capacity until cancelled
    app = gcp_app(make_provider(zones=[Z1]))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await create_from_the_form(pilot, app, "grpo")
        await until(pilot, lambda: "WAITING_FOR_RESOURCES" in ops_text(screen), "the request to wait")
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmModal)
        assert "queued request(s) of create grpo are deleted first" in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: not app.is_running, "the app to quit")
    assert emulator.queued_json(Z1, "grpo") is None  # gone before the app was


async def test_a_suspended_request_is_a_row_and_d_deletes_it(emulator, make_provider):
    emulator.add_queued(PROJECT, Z1, "parked", "v6e-16")
    emulator.suspend(Z1, "parked")
    app = gcp_app(make_provider(zones=[Z1]))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.refreshes >= 1, "the first listing")
        table = screen.query_one(NodeTable)
        name, where, _, _, state, *_ = table.get_row_at(0)
        assert (name, where) == ("parked", Z1) and str(state) == "SUSPENDED (holds quota until deleted)"
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmModal) and "holds quota until deleted" in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: "queued request parked deleted" in ops_text(screen), "the delete")
        assert emulator.queued_json(Z1, "parked") is None


async def test_d_on_a_request_row_deletes_that_request_not_the_node_of_its_name(emulator, make_provider):
    z2 = ZONES[1]
    emulator.add_node(PROJECT, Z1, "grpo", "v6e-8")
    emulator.add_queued(PROJECT, z2, "grpo", "v6e-8")
    app = gcp_app(make_provider(zones=[Z1, z2]))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.refreshes >= 1, "the first listing")
        table = screen.query_one(NodeTable)
        rows = [tuple(str(c) for c in table.get_row_at(i)[:2]) for i in range(table.row_count)]
        table.move_cursor(row=rows.index(("grpo", z2)))
        await pilot.press("d")
        assert isinstance(app.screen, ConfirmModal) and z2 in app.screen.question
        await pilot.press("y")
        await until(pilot, lambda: f"queued request grpo in {z2} deleted" in ops_text(screen), "the delete")
        assert emulator.queued_json(z2, "grpo") is None
        assert emulator.node_json(Z1, "grpo")["state"] == "READY"  # the node in the other zone is left be


async def test_the_forms_reservation_and_wait_for_reach_the_tpu_api(emulator, make_provider):
    app = gcp_app(make_provider(zones=[Z1]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.refreshes >= 1, "the first listing")
        await pilot.press("c")
        modal = app.screen
        modal.query_one("#name", Input).value = "grpo"
        modal.query_one("#provisioning").value = "reservation"
        modal.query_one("#reservation", Input).value = "rl-team"
        modal.query_one("#wait_for", Input).value = "2h"
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "grpo is READY" in ops_text(screen), "the create to finish")
        (sent,) = emulator.queued_created
        assert {k: v for k, v in sent["body"].items() if k != "tpu"} == {
            "reservationName": f"projects/{PROJECT}/locations/{Z1}/reservations/rl-team",
            "queueingPolicy": {"validUntilDuration": "7200s"},
        }
        assert f"{Z1}: queuing v6e-8 (reservation rl-team, v6e-ubuntu-2404, valid for 2h" in ops_text(screen)


async def test_a_race_from_the_form_lists_a_request_per_zone_under_one_name(emulator, make_provider):
    z2 = ZONES[1]
    emulator.stockout(Z1)
    emulator.stockout(z2)  # both wait: the listing holds two requests named grpo
    app = gcp_app(make_provider(zones=[Z1, z2]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.refreshes >= 1, "the first listing")
        await pilot.press("c")
        modal = app.screen
        modal.query_one("#name", Input).value = "grpo"
        modal.query_one("#zones", Input).value = f"{Z1},{z2}"
        modal.query_one("#race").value = True
        await pilot.pause()
        await pilot.press("ctrl+s")
        await until(pilot, lambda: ops_text(screen).count("WAITING_FOR_RESOURCES") >= 2, "both requests")
        await pilot.press("r")
        table = screen.query_one(NodeTable)
        await until(pilot, lambda: table.row_count == 2, "a row per zone's request")
        assert sorted(str(table.get_row_at(i)[1]) for i in range(2)) == sorted([Z1, z2])
