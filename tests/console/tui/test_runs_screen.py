"""Pilot tests of the runs screen (`R`): the history, marks, compare, refresh, open, help, back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from textual.widgets import DataTable, Static

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.compare import CompareModal
from tpu_console.tui.modals.help import HelpScreen
from tpu_console.tui.screens.nodes_screen import NodesScreen
from tpu_console.tui.screens.runs_screen import RunsScreen

pytestmark = pytest.mark.usefixtures("console_home")


@pytest.fixture(autouse=True)
def probes(monkeypatch) -> list[list[str]]:
    """Unfinished runs are probed when listed; the fake nodes have no workers, so the probe learns nothing."""
    from tpu_console.observe import lookup

    seen: list[list[str]] = []

    async def observe(providers, records, store, *args, **kwargs):
        seen.append([r.run_id for r in records])
        return [
            lookup.RunView(record=r, state=r.state, workers=[], live=False, problem="no workers")
            for r in records
        ]

    monkeypatch.setattr(lookup, "observe", observe)
    return seen


def add_run(
    run_id: str, state: str = "succeeded", summary: dict | None = None, finished: bool = True, **extra
) -> None:
    store = RunStore()
    store.add(
        RunRecord(
            run_id=run_id,
            node="pod-a",
            provider="fake",
            accelerator_type="v6e-16",
            workers=[0, 1],
            config_path="/c/tiny_local.yaml",
            config_digest="d",
            python="python3",
            started_at=NOW - timedelta(hours=1),
            state=state,
            finished_at=NOW - timedelta(minutes=30) if finished else None,
            **{"overrides": [], **extra},
        )
    )
    if summary:
        store.set_summary(run_id, summary)


async def open_runs(pilot) -> RunsScreen:
    app = pilot.app
    for _ in range(300):
        if getattr(app.screen, "refreshes", 0):
            break
        await pilot.pause(0.01)
    await pilot.press("R")
    screen = app.screen
    assert isinstance(screen, RunsScreen)
    await until_listed(pilot, screen, 1)
    return screen


async def until_listed(pilot, screen: RunsScreen, count: int) -> None:
    for _ in range(300):
        if screen.listings >= count:
            return
        await pilot.pause(0.01)
    raise AssertionError(f"the history was listed {screen.listings} times, expected {count}")


def run_ids(screen: RunsScreen) -> list[str]:
    table = screen.query_one("#runs", DataTable)
    return [str(table.get_row_at(i)[1]) for i in range(table.row_count)]


def app() -> TpuConsoleApp:
    return TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)


async def test_history_is_newest_first_and_r_reads_it_again(probes):
    add_run("20250314-100000-aaaa")
    add_run("20250314-110000-bbbb", state="running", finished=False)
    the_app = app()
    async with the_app.run_test(size=(100, 30)) as pilot:
        screen = await open_runs(pilot)
        assert run_ids(screen) == ["20250314-110000-bbbb", "20250314-100000-aaaa"]
        assert ["20250314-110000-bbbb"] in probes  # the unfinished run was probed, the finished one not
        add_run("20250314-113000-cccc")
        await pilot.press("r")
        await until_listed(pilot, screen, 2)
        assert run_ids(screen)[0] == "20250314-113000-cccc"


async def test_space_marks_and_unmarks_and_c_compares_three_runs_against_the_first_marked():
    for run_id, step_s in (
        ("20250314-100000-aaaa", 10.0),
        ("20250314-110000-bbbb", 12.0),
        ("20250314-120000-cccc", 8.0),
    ):
        add_run(run_id, summary={"time/train/step_avg_last10_s": step_s})
    the_app = app()
    async with the_app.run_test(size=(100, 30)) as pilot:
        screen = await open_runs(pilot)
        await pilot.press("space", "space")  # marked, then unmarked
        assert screen.marked == []
        await pilot.press("down", "down", "space", "up", "space", "up", "space")
        assert screen.marked == ["20250314-100000-aaaa", "20250314-110000-bbbb", "20250314-120000-cccc"]
        table = screen.query_one("#runs", DataTable)
        assert [str(table.get_row_at(i)[0]) for i in range(3)] == ["3", "2", "1"]
        assert "3 marked: c compares them" in str(screen.query_one("#status", Static).render())
        await pilot.press("c")
        modal = the_app.screen
        assert isinstance(modal, CompareModal)
        assert modal.headers[:2] == ("METRIC", "A 20250314-100000-aaaa")
        assert modal.headers[4:] == ("C 20250314-120000-cccc", "C VS A")
        step = next(row for row in modal.cells if row[0].startswith("step time"))
        assert step[1:] == ("10", "12", "+20.0%", "8", "-20.0%")
        await pilot.press("q")  # closes the comparison, not the app
        assert the_app.screen is screen and the_app.is_running


async def test_enter_opens_the_selected_run_in_the_run_dashboard():
    from tpu_console.tui.screens.run_screen import RunScreen

    add_run("20250314-100000-aaaa")
    add_run("20250314-110000-bbbb")
    the_app = app()
    async with the_app.run_test(size=(100, 30)) as pilot:
        await open_runs(pilot)
        await pilot.press("down", "enter")
        for _ in range(300):
            if isinstance(the_app.screen, RunScreen):
                break
            await pilot.pause(0.01)
        assert isinstance(the_app.screen, RunScreen) and the_app.screen.run_id == "20250314-100000-aaaa"


async def test_question_mark_lists_the_runs_keys_and_escape_goes_back():
    the_app = app()
    async with the_app.run_test(size=(100, 30)) as pilot:
        screen = await open_runs(pilot)
        assert "no runs yet" in str(screen.query_one("#status", Static).render())
        await pilot.press("question_mark")
        assert isinstance(the_app.screen, HelpScreen)
        text = " ".join(str(the_app.screen.query_one("#help-keys", Static).render()).split())
        for words in (
            "⏎ Open the run in the run dashboard",
            "space Mark",
            "c Compare",
            "r Refresh",
            "esc Back",
        ):
            assert words in text, text
        await pilot.press("escape", "escape")
        assert isinstance(the_app.screen, NodesScreen)


async def test_a_history_that_cannot_be_read_is_said_on_the_status_line(monkeypatch):
    from tpu_console.observe import lookup

    async def broken(*args, **kwargs):
        raise OSError("database is locked")

    monkeypatch.setattr(lookup, "list_runs", broken)
    the_app = app()
    async with the_app.run_test(size=(100, 30)) as pilot:
        screen = await open_runs(pilot)
        assert str(screen.query_one("#status", Static).render()) == (
            "could not read the history: database is locked; r tries again"
        )


async def test_the_line_under_the_table_says_why_the_highlighted_run_failed_and_how_it_was_launched():
    add_run(
        "20250314-100000-aaaa",
        state="failed",
        failure="worker 1 exited 1: RESOURCE_EXHAUSTED",
        overrides=["rollout.batch_size=64", "steps=40"],
        code_version="9f8506eb0fb7+dirty",
    )
    add_run("20250314-110000-bbbb")
    the_app = app()
    async with the_app.run_test(size=(100, 30)) as pilot:
        screen = await open_runs(pilot)
        detail = screen.query_one("#detail", Static)
        await pilot.pause()
        assert str(detail.render()) == "20250314-110000-bbbb on pod-a (v6e-16) · no problem recorded"
        await pilot.press("down")
        await pilot.pause()
        assert str(detail.render()) == (
            "20250314-100000-aaaa on pod-a (v6e-16) · worker 1 exited 1: RESOURCE_EXHAUSTED"
            " · --set rollout.batch_size=64 steps=40 · code 9f8506eb0fb7+dirty"
        )


async def test_a_run_only_the_bucket_knows_is_listed_and_a_bucket_out_of_reach_is_a_note(
        console_home, monkeypatch):  # noqa: F811
    import json

    from tpu_console.history import bucket_record

    shared = console_home.parent / "team-bucket"  # a file:// bucket: a folder standing for gs://
    (shared / "runs").mkdir(parents=True)
    (shared / "runs" / "20250314-090000-dddd.json").write_text(json.dumps({
        "run_id": "20250314-090000-dddd", "node": "gone", "provider": "gcp", "outcome": "stopped",
        "reason": "max-hang", "written_at": NOW.timestamp(),
        "launch": {"workers": [0], "started_at": (NOW - timedelta(hours=2)).isoformat()},
        "decisions": [{"t": NOW.timestamp(), "decision": "max-hang", "message": "no step for 30m"},
                      {"t": NOW.timestamp(), "decision": "deleting", "message": "deleting node gone"}],
        "workers": {"0": {"state": "done", "exit_status": 143, "stopped": "supervisor"}}}))
    console_home.mkdir(parents=True, exist_ok=True)
    (console_home / "config.toml").write_text(f'[gcp]\nbucket = "file://{shared}"\n')
    add_run("20250314-100000-aaaa")
    async with app().run_test(size=(100, 30)) as pilot:
        screen = await open_runs(pilot)
        assert run_ids(screen) == ["20250314-100000-aaaa", "20250314-090000-dddd"]
        assert "max-hang" in (RunStore().get("20250314-090000-dddd").failure or "")
        (console_home / "config.toml").write_text('[gcp]\nbucket = "gs://team-bucket"\n')
        monkeypatch.setenv(bucket_record.EMULATOR_ENV, "http://127.0.0.1:9")  # nothing listens there
        await pilot.press("r")
        await until_listed(pilot, screen, 2)
        assert "cannot be read" in str(screen.query_one("#status", Static).render())
        assert len(run_ids(screen)) == 2  # the history is still listed


async def test_a_colleagues_run_found_on_the_pod_is_listed_and_its_dashboard_marked_as_theirs(monkeypatch):
    from textual.widgets import Input

    from tpu_console.history import discovery
    from tpu_console.tui.modals.stop_theirs import StopTheirsModal
    from tpu_console.tui.screens.run_screen import RunScreen
    from tpu_console.tui.widgets.run_header import RunHeader

    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("LOGNAME", "alice")
    add_run("20250314-100000-aaaa", launched_by={"user": "alice", "host": "alices-laptop", "home": "a"})
    asked: list[str] = []

    async def run_folders_on(providers, store, node):  # what pod-a's first worker holds: bob's run
        asked.append(node)
        store.add(discovery.record_from_launch("20250314-110000-bbbb", {
            "node": node, "provider": "fake", "accelerator_type": "v6e-16", "workers": [0, 1],
            "started_at": (NOW - timedelta(minutes=5)).isoformat(), "command": ["python", "train.py"],
            "launched_by": {"user": "bob", "host": "bobs-laptop", "home": "b"}}, node))
        return ["20250314-110000-bbbb"]

    monkeypatch.setattr(discovery, "discover", run_folders_on)
    the_app = app()
    async with the_app.run_test(size=(100, 30)) as pilot:
        screen = await open_runs(pilot)
        assert asked == ["pod-a"]
        table = screen.query_one(DataTable)
        assert [str(table.get_row_at(i)[0]) for i in range(table.row_count)] == ["bob", ""]  # yours: no mark
        await pilot.pause()
        detail = str(screen.query_one("#detail", Static).render())
        assert detail.startswith("20250314-110000-bbbb on pod-a (v6e-16) · bob on bobs-laptop's run")
        await pilot.press("enter")
        for _ in range(300):
            if isinstance(the_app.screen, RunScreen):
                break
            await pilot.pause(0.01)
        assert the_app.screen.run_id == "20250314-110000-bbbb"
        await pilot.pause()
        title = str(the_app.screen.query_one(RunHeader).query_one("#run-title", Static).render())
        assert title.startswith("bob on bobs-laptop's run 20250314-110000-bbbb"), title
        # stopping it asks for its run id typed back, naming whose it is
        await pilot.press("x")
        assert isinstance(the_app.screen, StopTheirsModal)
        assert "bob on bobs-laptop's run" in str(the_app.screen.query_one(Static).render())
        the_app.screen.query_one("#typed", Input).value = "20250314-100000-aaaa"
        await pilot.press("enter")
        assert "does not match" in str(the_app.screen.query_one("#error", Static).render())
        await pilot.press("escape")
        assert isinstance(the_app.screen, RunScreen)
