"""`R`: the run history (the SQLite store, unfinished runs probed), newest first. `space` marks runs,
`c` compares the marked ones (two or more), `enter` opens one in the run dashboard, `esc` goes back."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from tpu_console import run_table
from tpu_console.errors import one_line
from tpu_console.providers.base import Provider
from tpu_console.runs import control
from tpu_console.runs.control import RunView
from tpu_console.runs.store import RunStore
from tpu_console.runs.summary import compare_table, run_summary
from tpu_console.tui.modals.compare import CompareModal
from tpu_console.tui.styles import RUN_STATE_STYLES


class RunsListed(Message):
    def __init__(self, views: list[RunView], problem: str | None = None) -> None:
        super().__init__()
        self.views = views
        self.problem = problem


class RunsScreen(Screen[None]):
    DEFAULT_CSS = """
    RunsScreen #runs { height: 1fr; }
    RunsScreen #status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "mark", "Mark", id="runs.mark"),
        Binding("c", "compare", "Compare marked", id="runs.compare"),
        Binding("enter", "open", "Open", id="runs.open"),
        Binding("r", "refresh", "Refresh", id="runs.refresh"),
        Binding("escape", "back", "Back", id="runs.back"),
    ]

    def __init__(self, providers: dict[str, Provider], *, store: RunStore | None = None,
                 clock: Callable[[], datetime]) -> None:
        super().__init__()
        self.providers = providers
        self.store = store
        self.clock = clock
        self.views: list[RunView] = []
        self.marked: list[str] = []  # in the order marked: the first is A in the comparison
        self.listings = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static("loading runs...", id="status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#runs", DataTable)
        table.add_column("", key="mark")
        for column in run_table.RUN_COLUMNS:
            table.add_column(column, key=column)
        table.focus()
        self.action_refresh()

    def action_refresh(self) -> None:
        self.list_runs()

    @work(exclusive=True, group="runs", exit_on_error=False)
    async def list_runs(self) -> None:
        try:
            views = await control.list_runs(self.providers, store=self.store or RunStore(), limit=200)
        except Exception as exc:  # noqa: BLE001 - shown on screen; r tries again
            self.post_message(RunsListed([], f"could not read the history: {one_line(exc)}"))
            return
        self.post_message(RunsListed(views))

    def on_runs_listed(self, message: RunsListed) -> None:
        self.listings += 1
        self.views = message.views
        self._show()
        count = len(self.views)
        text = message.problem or (f"{count} run{'s' if count != 1 else ''} · space marks, c compares the marked"
                                   if count else "no runs yet: launch one from the nodes screen (l)")
        self.query_one("#status", Static).update(text)

    def _show(self) -> None:
        table = self.query_one("#runs", DataTable)
        cursor = table.cursor_row
        table.clear()
        now = self.clock()
        for view in self.views:
            cells = run_table.run_row(view, now)
            mark = str(self.marked.index(view.record.run_id) + 1) if view.record.run_id in self.marked else ""
            state = Text(cells[3], style=RUN_STATE_STYLES.get(cells[3], ""))
            table.add_row(Text(mark, style="bold reverse"), *cells[:3], state, *cells[4:], key=view.record.run_id)
        if self.views:
            table.move_cursor(row=min(cursor, len(self.views) - 1))

    def _current(self) -> RunView | None:
        table = self.query_one("#runs", DataTable)
        if not self.views or table.cursor_row >= len(self.views):
            return None
        return self.views[table.cursor_row]

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
        summaries = [run_summary(v.record, {s.worker: s.events.last_step for s in v.workers}) for v in chosen]
        headers, cells = compare_table([v.record.run_id for v in chosen], summaries)
        self.app.push_screen(CompareModal(headers, cells))

    def action_open(self) -> None:
        view = self._current()
        if view is None:
            return
        from tpu_console.tui.screens.run_screen import RunScreen

        self.app.push_screen(RunScreen(self.providers, view.record.run_id, self.store, clock=self.clock))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_back(self) -> None:
        self.app.pop_screen()
