"""Pilot tests of the run dashboard: every key, with a feed of fixed messages (no pod, no I/O)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from rich.console import Console
from textual import events
from textual.widgets import Static, TabbedContent

from tests.console.tui.fixtures_run_dashboard import (
    OOM_LINE,
    RUN_ID,
    WORKERS,
    FixedFeed,
    failed_run,
    hung_run,
    running_run,
    stopped_run,
)
from tests.fixtures_cli import NOW
from tpu_console.tui import app as app_module
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.messages import RunLogLines, RunSupervisorDecided
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.modals.full_text import FullTextModal
from tpu_console.tui.modals.help import HelpScreen
from tpu_console.tui.modals.stacks import StacksModal
from tpu_console.tui.screens.run_screen import RunScreen
from tpu_console.tui.widgets.log_pane import LogPane, LogStatus
from tpu_console.tui.widgets.run_log_search import LogSearch
from tpu_console.tui.widgets.worker_grid import WorkerGrid

SIZE = (100, 30)


class DashboardApp(TpuConsoleApp):
    """The real app with the run dashboard opened on top of its first screen."""

    # relative to app.py, not here
    CSS_PATH = str(Path(app_module.__file__).with_name(TpuConsoleApp.CSS_PATH))

    def __init__(self, feed: FixedFeed | None, screen: RunScreen | None = None) -> None:
        super().__init__({}, refresh_every=3600, clock=lambda: NOW)
        self.run_screen = screen or RunScreen({}, RUN_ID, clock=lambda: NOW, feed=feed)

    def on_mount(self) -> None:
        self.push_screen(self.run_screen)


async def opened(pilot, feed: FixedFeed) -> RunScreen:
    await asyncio.wait_for(feed.posted.wait(), 30)
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, RunScreen)
    return screen


def running_app() -> tuple[DashboardApp, FixedFeed]:
    feed = FixedFeed(*running_run())
    return DashboardApp(feed), feed


def text_of(widget: Static) -> str:
    """What a Static shows, as plain text (tables and groups included)."""
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


def grid_rows(screen: RunScreen) -> list[list[str]]:
    table = screen.query_one(WorkerGrid)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def log_status(screen: RunScreen) -> str:
    return text_of(screen.query_one(LogStatus))


async def test_grid_shows_every_worker_with_the_straggler_and_the_stall():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        rows = grid_rows(screen)
        assert [row[:3] for row in rows] == [["0 ", "running", "12"], ["1 ", "running", "12"],
                                            ["2 ", "running", "12"], ["3 ", "stalled 95s", "9"]]
        assert rows[2][3] == "5.32s 1.6x"  # the straggler, against the other workers' median
        assert rows[0][3] == "3.30s" and rows[0][4] == "-"
        assert rows[0][5].startswith("step=12 loss=0.0200")
        notes = text_of(screen.query_one("#run-notes", Static))
        assert "stalled: W3" in notes and "stragglers: W2" in notes
        assert "W&B https://wandb.ai/lab/grpo/runs/k2x9q1" in notes


async def test_an_ended_run_shows_its_verdict_exit_codes_and_first_failure():
    feed = FixedFeed(*failed_run())
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        assert "ended: FAILED" in text_of(screen.query_one("#run-title", Static))
        # The exit alone says little; the log signature says what happened, and the fix.
        assert text_of(screen.query_one("#run-notes", Static)).startswith(
            "first failure: worker 1 exited 1  ·  W1 log: out of HBM: Used 17.44G of 15.48G hbm; out of "
            "device "
            "memory: reduce rollout.batch_size"
        )
        rows = grid_rows(screen)
        assert [(row[0], row[1], row[4]) for row in rows] == [
            ("0 ", "failed", "143"),
            ("1!", "FAILED first", "1"),
            ("2 ", "failed", "143"),
            ("3 ", "failed", "143"),
        ]
        assert rows[1][5].startswith("out of HBM: Used 17.44G of 15.48G hbm")
        assert [n.title for n in app._notifications] == ["worker 1's log", "run ended"]
        await pilot.press("m")
        hbm = text_of(screen.query_one("#hbm", Static))
        assert (
            "not reported" in hbm
            and "LIBTPU: the run has ended: libtpu reports only while a job holds the TPU" in hbm
        )
        await pilot.press("x")  # nothing left to stop
        assert not isinstance(app.screen, ConfirmModal) and feed.stops == 0
        assert "has ended already" in list(app._notifications)[-1].message


async def test_digits_follow_one_worker_and_an_unknown_worker_is_refused():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        pane = screen.query_one(LogPane)
        assert pane.worker is None and len(pane.visible_text()) == 12 * WORKERS
        await pilot.press("2")
        assert pane.worker == 2 and screen.worker == 2
        assert pane.visible_text()[-1] == "[w2] step=12 loss=0.0200 reward_mean=0.82"
        assert len(pane.visible_text()) == 12
        assert screen.query_one(WorkerGrid).cursor_row == 2
        assert "log: worker 2" in log_status(screen)
        await pilot.press("s")
        assert "W2 (step 12)" in text_of(screen.query_one("#breakdown", Static))
        await pilot.press("l")
        await pilot.press("7")
        assert pane.worker == 2
        assert any("no worker 7" in n.message for n in app._notifications)


async def test_tab_cycles_workers_and_a_goes_back_to_all_interleaved():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        seen = []
        for _ in range(WORKERS + 1):
            await pilot.press("tab")
            seen.append(screen.worker)
        assert seen == [0, 1, 2, 3, 0]
        await pilot.press("shift+tab")
        assert screen.worker == 3
        await pilot.press("a")
        pane = screen.query_one(LogPane)
        assert screen.worker is None and pane.worker is None
        assert pane.visible_text()[-1] == "[3]  [w3] step=12 loss=0.0200 reward_mean=0.82"
        assert "all workers, interleaved" in log_status(screen)
        assert screen.query_one(WorkerGrid).show_cursor is False


async def test_f_stops_and_resumes_following_new_lines():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        pane = screen.query_one(LogPane)
        assert pane.follow and pane.scroll_y == pane.max_scroll_y > 0
        await pilot.press("f")
        assert not pane.follow and "follow OFF" in log_status(screen)
        pane.scroll_to(y=0, animate=False, immediate=True)
        screen.post_message(RunLogLines([(0, f"more {i}") for i in range(40)]))
        await pilot.pause()
        assert pane.scroll_y == 0  # frozen where the reader is
        await pilot.press("f")
        await pilot.pause()
        assert pane.follow and pane.scroll_y == pane.max_scroll_y
        # a progress bar's redraw
        screen.post_message(RunLogLines([(1, "newest\r\x1b[1mnewest line\x1b[0m")]))
        await pilot.pause()
        assert pane.scroll_y == pane.max_scroll_y and pane.visible_text()[-1] == "[1]  newest line"


async def test_slash_searches_n_and_shift_n_move_between_matches_and_escape_closes():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        await pilot.press("s")  # search works from any tab: it brings the log back
        await pilot.press("slash")
        search = screen.query_one(LogSearch)
        assert search.has_focus and screen.query_one(TabbedContent).active == "tab-logs"
        await pilot.press(*"STEP=3 ", "enter")  # case-insensitive; the trailing space is trimmed
        pane = screen.query_one(LogPane)
        assert pane.search_term == "STEP=3"
        assert len(pane.matches) == WORKERS and pane.current_match == WORKERS - 1
        assert not search.has_focus and pane.has_focus and not pane.follow
        assert "/STEP=3: 4 matches (4/4)" in log_status(screen)
        await pilot.press("n")
        assert pane.current_match == 0
        await pilot.press("N", "N")
        assert pane.current_match == WORKERS - 2
        line = pane.matches[pane.current_match]
        assert pane.scroll_y <= line < pane.scroll_y + pane.size.height
        await pilot.press("slash", "x")
        await pilot.press("escape")  # closes the prompt, not the screen
        assert isinstance(app.screen, RunScreen) and not search.has_class("-open")
        assert pane.search_term == "STEP=3"


async def test_letters_switch_tabs():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        tabs = screen.query_one(TabbedContent)
        for key, tab in (("s", "tab-steps"), ("m", "tab-hbm"), ("p", "tab-plots"), ("l", "tab-logs")):
            await pilot.press(key)
            assert tabs.active == tab
        await pilot.press("m")
        assert "near the limit (>= 90%): W1" in text_of(screen.query_one("#hbm", Static))
        await pilot.press("s")
        breakdown = text_of(screen.query_one("#breakdown", Static))
        # W2's pace over its last steps (observe/stragglers.py)
        assert ("stragglers (vs the other workers' median): W2 1.6x the median step for the last 12 steps "
                "(5.27s vs 3.26s)") in breakdown
        assert "W2 1.9x" in breakdown  # the slowest rollout, against the other workers' median


async def test_help_lists_the_dashboard_keys_and_escape_goes_back():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, feed)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        keys = " ".join(text_of(app.screen.query_one("#help-keys", Static)).split())
        for key, action in (
            ("esc", "Back"),
            ("0-9", "Worker"),
            ("tab", "Next"),
            ("a", "All"),
            ("f", "Follow"),
            ("/", "Search"),
            ("l", "Logs"),
            ("s", "Steps"),
            ("m", "HBM"),
            ("p", "Plots"),
            ("x", "Stop"),
            ("t", "Stacks"),
        ):
            assert f"{key} {action}" in keys
        await pilot.press("escape")
        assert isinstance(app.screen, RunScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, RunScreen)


async def test_bindings_have_ids_for_remapping():
    ids = {b.id for b in RunScreen.BINDINGS}
    assert {
        "run.back",
        "run.worker_0",
        "run.worker_9",
        "run.next_worker",
        "run.all_workers",
        "run.follow",
        "run.wrap",
        "run.first_failure",
        "run.worker_error",
        "run.search",
        "run.next_match",
        "run.previous_match",
        "run.tab_plots",
        "run.stop",
    } <= ids
    assert None not in ids


async def test_keys_typed_right_after_slash_reach_the_search_box_from_any_tab():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        for tab_key in ("s", "l"):
            await pilot.press(tab_key)
            # All at once, as a fast typist's keys reach the app: no pause for a frame in between.
            for key, char in (("slash", "/"), ("s", "s"), ("t", "t"), ("e", "e"), ("p", "p")):
                app.post_message(events.Key(key, char))
            await pilot.pause()
            search = screen.query_one(LogSearch)
            assert search.has_focus and search.value == "step", tab_key
            assert screen.query_one(TabbedContent).active == "tab-logs"
            await pilot.press("slash")  # in the box, / is a character, not the binding
            assert search.value == "step/"
            await pilot.press("escape")


async def test_workers_hung_after_a_failure_are_shown_first_and_x_stops_the_run_after_a_yes():
    feed = FixedFeed(*hung_run())
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        assert "partially-dead" in text_of(screen.query_one("#run-title", Static))
        notes = text_of(screen.query_one("#run-notes", Static))
        assert notes.startswith(" HUNG: W0,W2,W3 still running after W1 failed; x stops the run ")
        assert [row[1] for row in grid_rows(screen)] == ["HUNG", "FAILED first", "HUNG", "HUNG"]
        assert {n.title for n in app._notifications} == {"run hung", "worker 1's log"}
        assert any("x stops the run" in n.message for n in app._notifications if n.title == "run hung")

        await pilot.press("x")
        assert isinstance(app.screen, ConfirmModal)
        assert "Worker(s) 0, 2, 3 still run after worker 1 failed" in app.screen.question
        await pilot.press("n")
        assert isinstance(app.screen, RunScreen) and feed.stops == 0

        await pilot.press("x", "y")
        stopping = [w for w in screen.workers if w.group == "run-stop"]
        await asyncio.wait_for(asyncio.gather(*(w.wait() for w in stopping)), 10)
        await pilot.pause()
        assert feed.stops == 1
        assert list(app._notifications)[-1].message == f"{RUN_ID}: stopped (4 stopped)"


async def test_hbm_tab_shows_libtpu_metrics_beside_the_trainer_numbers():
    app, feed = running_app()
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        await pilot.press("m")
        await pilot.pause()
        hbm = text_of(screen.query_one("#hbm", Static))
        assert "LIBTPU HBM" in hbm and "DUTY" in hbm
        row_1 = next(line for line in hbm.splitlines() if line.startswith("1 "))
        assert "14.6G" in row_1 and "15.2G" in row_1 and "15.1/15.8G" in row_1 and "83%" in row_1
        assert "near the limit (>= 90%): W1" in hbm
        await pilot.press("2")
        hbm = text_of(screen.query_one("#hbm", Static))
        assert (
            "W2 devices:  0: 10.6/15.8G 80%  1: 10.8/15.8G 82%  2: 11.0/15.8G 84%  3: 11.2/15.8G 86%" in hbm
        )
        await pilot.press("l")  # libtpu is read only while the tab is shown
        await pilot.pause()
        assert not [w for w in screen.workers if w.group == "run-devices" and not w.is_finished]


def pane_rows(screen: RunScreen) -> list[str]:
    """The log pane's rows as drawn on screen now."""
    pane = screen.query_one(LogPane)
    return [pane.render_line(y).text.rstrip() for y in range(pane.size.height)]


async def test_long_log_lines_wrap_at_100_columns_and_w_cuts_them_like_less_s():
    feed = FixedFeed(*failed_run())
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        pane = screen.query_one(LogPane)
        shown = "".join(row[5:] for row in pane_rows(screen))  # the rows after each "[1]  " prefix
        assert pane.wrap and OOM_LINE.replace(" ", "") in shown.replace(" ", "")  # the whole line, wrapped
        assert pane.row_count() > pane.view_length()
        assert "wrap" in log_status(screen)
        await pilot.press("w")
        assert not pane.wrap and pane.row_count() == pane.view_length()
        rows = pane_rows(screen)
        assert "Exceeded hbm capacity" not in "".join(rows)  # cut at the width, as less -S shows it
        assert any(row.startswith("[1]  jaxlib.xla_extension.XlaRuntimeError") for row in rows)
        assert "cut (w wraps)" in log_status(screen)
        await pilot.press("w")
        assert pane.wrap and "Exceeded hbm capacity by 1.96G." in "".join(pane_rows(screen))


async def test_e_opens_the_first_failure_whole_and_enter_a_workers_last_error():
    feed = FixedFeed(*failed_run())
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, feed)
        await pilot.press("e")
        modal = app.screen
        assert isinstance(modal, FullTextModal)
        body = text_of(modal.query_one("#body", Static))
        # the whole of it, however long: the signature's fix, which the header's one line cuts
        assert "first failure" in text_of(modal.query_one("#title", Static))
        assert body.startswith("worker 1 exited 1")
        assert "out of device memory: reduce rollout.batch_size" in " ".join(body.split())
        await pilot.press("escape")
        assert isinstance(app.screen, RunScreen)
        await pilot.press("1", "enter")  # worker 1's row, then its last error
        modal = app.screen
        assert isinstance(modal, FullTextModal)
        assert "worker 1 of" in text_of(modal.query_one("#title", Static))
        body = " ".join(text_of(modal.query_one("#body", Static)).split())
        assert "state: exited, exit status 1" in body and "Used 17.44G of 15.48G hbm" in body
        await pilot.press("enter")  # enter closes it as well
        assert isinstance(app.screen, RunScreen)


async def test_a_run_stopped_with_x_reads_stopped_and_names_no_failure():
    feed = FixedFeed(*stopped_run())
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        screen = await opened(pilot, feed)
        assert "ended: STOPPED" in text_of(screen.query_one("#run-title", Static))
        assert "4 exited of 4" in text_of(screen.query_one("#run-title", Static))
        assert "failure" not in text_of(screen.query_one("#run-notes", Static))
        assert [(row[0], row[1], row[4]) for row in grid_rows(screen)] == [
            (f"{w} ", "stopped", "143") for w in range(4)
        ]
        await pilot.press("e")
        assert isinstance(app.screen, RunScreen)  # nothing failed: nothing to open
        assert "nothing has failed" in list(app._notifications)[-1].message


async def test_t_shows_where_every_worker_is_stuck():
    feed = FixedFeed(*hung_run())
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, feed)
        assert any("t shows where each one waits" in n.message for n in app._notifications)
        await pilot.press("t")
        assert isinstance(app.screen, StacksModal)
        modal = app.screen
        await asyncio.wait_for(asyncio.gather(*(w.wait() for w in modal.workers if w.group == "stacks")), 10)
        await pilot.pause()
        shown = text_of(modal.query_one("#stacks", Static))
        assert "workers 0,2,3: trainer/grpo.py:201 (update); worker 1: did not answer" in shown
        await pilot.press("escape")
        assert isinstance(app.screen, RunScreen)


async def test_the_supervisors_decisions_show_on_the_dashboard():
    status, logs, devices = running_run()
    said = "worker 1 exited 1: stopping worker(s) 0,2,3 (they would wait in a collective)"
    decided = RunSupervisorDecided([said])
    feed = FixedFeed(status, [*logs, decided], devices)
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await opened(pilot, feed)
        for _ in range(300):  # the decision is a message behind the feed's: loaded, it comes pauses later
            if shown := [n for n in app._notifications if n.title == "supervisor on the pod"]:
                break
            await pilot.pause(0.01)
        assert [n.message for n in shown] == [said]
