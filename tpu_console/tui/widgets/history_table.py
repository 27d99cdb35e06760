"""The runs screen's table: the history, newest first, with the marks that pick runs to compare (1 is A,
the base of the comparison). It only draws the runs it is given."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from rich.markup import escape
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import DataTable

from tpu_console.history import ownership
from tpu_console.observe.lookup import RunView
from tpu_console.tui.styles import RUN_STATE_STYLES
from tpu_console.views import runs as run_table


class HistoryTable(DataTable):
    # As in the nodes table: enter selects the row (RowSelected), which the screen opens; named here so
    # the footer and help say what it does.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Open", key_display="⏎", id="runs.open",
                tooltip="the run in the run dashboard"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.views: list[RunView] = []

    def on_mount(self) -> None:
        self.add_column("", key="mark")
        for column in run_table.RUN_COLUMNS:
            self.add_column(column, key=column)

    def show(self, views: list[RunView], marked: list[str], now: datetime) -> None:
        cursor = self.cursor_row
        self.clear()
        self.views = list(views)
        for view in self.views:
            run_id = view.record.run_id
            cells = run_table.run_row(view, now)
            state = Text(cells[3], style=RUN_STATE_STYLES.get(cells[3], ""))
            self.add_row(mark_cell(view, marked), *cells[:3], state, *cells[4:], key=run_id)
        if self.views:
            self.move_cursor(row=min(cursor, len(self.views) - 1))

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.post_message(self.RunHighlighted(self.current()))

    class RunHighlighted(Message):
        """The cursor is on another run (None: no run), for the screen's detail line."""

        def __init__(self, view: RunView | None) -> None:
            super().__init__()
            self.view = view

    def current(self) -> RunView | None:
        if not self.views or not 0 <= self.cursor_row < len(self.views):
            return None
        return self.views[self.cursor_row]


def mark_cell(view: RunView, marked: list[str]) -> Text:
    """The compare mark (1 is A); else, for a run another person launched, whose it is."""
    run_id = view.record.run_id
    if run_id in marked:
        return Text(str(marked.index(run_id) + 1), style="bold reverse")
    if not ownership.is_mine(view.record.launched_by):
        return Text(ownership.owner(view.record.launched_by) or "", style="magenta")
    return Text("")


def run_detail(view: RunView | None) -> str:
    """What the table has no room for at 100 columns: the note (why it failed), the overrides and the code."""
    if view is None:
        return ""
    record = view.record
    parts = [f"{record.run_id} on {record.node} ({record.accelerator_type})"]
    if not ownership.is_mine(record.launched_by):
        parts.append(f"[magenta]{escape(ownership.describe(record.launched_by))}'s run[/magenta]")
    note = view.failure or view.problem
    parts.append(f"[b red]{escape(note)}[/b red]" if note and view.state in {"failed", "partially-dead"}
                 else escape(note) if note else "no problem recorded")
    if record.overrides:
        parts.append("--set " + escape(" ".join(record.overrides)))
    if record.code_version or record.project:
        parts.append(f"code {escape(record.code_text())}")
    return " · ".join(parts)
