"""`R`: the run history (the SQLite store, unfinished runs probed), newest first. `space` marks runs,
`c` compares the marked ones (two or more), `enter` opens one in the run dashboard, `esc` goes back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from tpu_console.errors import one_line
from tpu_console.history import bucket_record, discovery
from tpu_console.history.goodput import summary_fields
from tpu_console.history.store import RunStore
from tpu_console.history.summary import compare_rows, compare_table, run_summary
from tpu_console.observe import lookup
from tpu_console.observe.goodput_report import archived_goodput
from tpu_console.observe.lookup import RunView
from tpu_console.providers.base import Provider
from tpu_console.settings import load_settings
from tpu_console.tui.messages import RunsListed
from tpu_console.tui.modals.compare import CompareModal
from tpu_console.tui.widgets.history_table import HistoryTable, run_detail

HISTORY_LIMIT = 200


class RunsScreen(Screen[None]):
    HELP_TITLE = "Keys: runs"
    DEFAULT_CSS = """
    RunsScreen #runs { height: 1fr; }
    RunsScreen #detail { height: auto; max-height: 3; padding: 0 1; }
    RunsScreen #status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "space", "mark", "Mark", id="runs.mark", tooltip="mark or unmark the run (the first marked is A)"
        ),
        Binding(
            "c",
            "compare",
            "Compare",
            id="runs.compare",
            tooltip="the marked runs side by side, each against A in percent",
        ),
        Binding(
            "r", "refresh", "Refresh", id="runs.refresh", tooltip="read the history again, probing live runs"
        ),
        Binding("escape", "back", "Back", id="runs.back", tooltip="back to the nodes"),
    ]

    def __init__(
        self, providers: dict[str, Provider], *, store: RunStore | None = None, clock: Callable[[], datetime]
    ) -> None:
        super().__init__()
        self.providers = providers
        self.store = store
        self.clock = clock
        self.views: list[RunView] = []
        self.marked: list[str] = []  # in the order marked: the first is A in the comparison
        self.listings = 0
        self.problem: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield HistoryTable(id="runs")
        yield Static("", id="detail")
        yield Static("loading runs...", id="status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(HistoryTable).focus()
        self.action_refresh()

    def action_refresh(self) -> None:
        self.query_one("#status", Static).update("reading the history...")
        self.list_runs()

    @work(exclusive=True, group="runs", exit_on_error=False)
    async def list_runs(self) -> None:
        # exclusive: `r` pressed again while unfinished runs are probed starts over instead of piling up.
        try:
            store = self.store or RunStore()
            # the bucket's run records first, as `runs` does (history/bucket_record.py); out of reach: a note
            warning = await asyncio.to_thread(bucket_record.merge_into_history, load_settings(), store)
            # and the nodes' run folders: a colleague's run is listed too (history/discovery.py)
            await discovery.discover_all(self.providers, store)
            views = await lookup.list_runs(self.providers, store=store, limit=HISTORY_LIMIT)
        except Exception as exc:  # noqa: BLE001 - shown on screen; r tries again
            self.post_message(RunsListed([], f"could not read the history: {one_line(exc)}; r tries again"))
            return
        self.post_message(RunsListed(views, warning))

    def on_runs_listed(self, message: RunsListed) -> None:
        self.listings += 1
        self.views = message.views
        known = {v.record.run_id for v in self.views}
        self.marked = [run_id for run_id in self.marked if run_id in known]
        self.problem = message.problem
        self._show()

    def _show(self) -> None:
        self.query_one(HistoryTable).show(self.views, self.marked, self.clock())
        count = len(self.views)
        if self.problem:
            text = self.problem
        elif not count:
            text = "no runs yet: launch one from the nodes screen (l)"
        else:
            text = f"{count} run{'s' if count != 1 else ''} · "
            text += (
                f"{len(self.marked)} marked: c compares them"
                if len(self.marked) >= 2
                else "space marks runs (two or more), c compares them"
            )
        self.query_one("#status", Static).update(text)

    def on_history_table_run_highlighted(self, message: HistoryTable.RunHighlighted) -> None:
        self.query_one("#detail", Static).update(run_detail(message.view))

    def _current(self) -> RunView | None:
        return self.query_one(HistoryTable).current()

    def action_mark(self) -> None:
        view = self._current()
        if view is None:
            return
        run_id = view.record.run_id
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked.append(run_id)
        self._show()

    def action_compare(self) -> None:
        chosen = [v for run_id in self.marked for v in self.views if v.record.run_id == run_id]
        if len(chosen) < 2:
            self.notify("mark two or more runs with space first", severity="warning")
            return
        summaries = [run_summary(v.record, {s.worker: s.events.last_step for s in v.workers})
                     | summary_fields(archived_goodput(v.record, self.store or RunStore())) for v in chosen]
        run_ids = [v.record.run_id for v in chosen]
        headers, cells = compare_table(run_ids, summaries)
        lower_is_better = [row["lower_is_better"] for row in compare_rows(run_ids, summaries)]
        self.app.push_screen(CompareModal(headers, cells, lower_is_better))

    def action_open(self) -> None:
        view = self._current()
        if view is None:
            return
        from tpu_console.tui.screens.run_screen import RunScreen

        self.app.push_screen(RunScreen(self.providers, view.record.run_id, self.store, clock=self.clock))

    def on_data_table_row_selected(self, _event: HistoryTable.RowSelected) -> None:
        self.action_open()

    def action_back(self) -> None:
        self.app.pop_screen()
