"""`M`: managed runs, as the controller's store holds them (docs/managed-runs.md): the acting controller and
its last heartbeat, a row per managed run, and the highlighted run's incarnations (node, zone, from-to,
how each ended) and recoveries (seconds from the loss to the first new step, what they were made of, the
steps lost). Read again every few seconds; `x` cancels the highlighted run (the controller stops it and
deletes what it made for it at its next pass), `esc` goes back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from tpu_console.controller import state as st
from tpu_console.controller.lease import read_lease
from tpu_console.controller.state import ManagedRun
from tpu_console.controller.store import open_store
from tpu_console.errors import one_line
from tpu_console.settings import load_settings
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.views.managed import MANAGED_COLUMNS, describe_lease, incarnation_lines, managed_row

REFRESH_S = 5.0


@dataclass
class ManagedListed(Message):
    """What the controller's store holds now, or why it could not be read."""

    runs: list[ManagedRun]
    controller: str
    problem: str | None = None


class ManagedScreen(Screen[None]):
    HELP_TITLE = "Keys: managed runs"
    DEFAULT_CSS = """
    ManagedScreen #controller { height: 1; padding: 0 1; background: $panel; }
    ManagedScreen #managed { height: 1fr; }
    ManagedScreen #incarnations { height: auto; max-height: 16; padding: 0 1; }
    ManagedScreen #status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "refresh", "Refresh", id="managed.refresh", tooltip="read the controller's store again"),
        Binding("x", "cancel_run", "Cancel", id="managed.cancel",
                tooltip="stop the managed run and delete what the controller made for it"),
        Binding("escape", "back", "Back", id="managed.back", tooltip="back to the previous screen"),
    ]

    def __init__(self, *, store: Any = None, refresh_s: float = REFRESH_S) -> None:
        super().__init__()
        self.store = store  # the controller's store; None: the configured one (bucket, or this home's folder)
        self.refresh_s = refresh_s
        self.runs: list[ManagedRun] = []
        self.listings = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("controller: reading...", id="controller")
        table: DataTable[str] = DataTable(id="managed", cursor_type="row", zebra_stripes=True)
        table.add_columns(*MANAGED_COLUMNS)
        yield table
        yield Static("", id="incarnations")
        yield Static("reading the controller's store...", id="status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()
        self.action_refresh()
        self.set_interval(self.refresh_s, self.action_refresh)

    def _store(self) -> Any:
        if self.store is None:
            self.store = open_store(load_settings())
        return self.store

    def action_refresh(self) -> None:
        self.read_store()

    @work(exclusive=True, group="managed", exit_on_error=False)
    async def read_store(self) -> None:
        def read() -> ManagedListed:
            store = self._store()
            runs = sorted((s.run for s in st.all_runs(store)), key=lambda r: r.created, reverse=True)
            return ManagedListed(runs, f"controller: {describe_lease(read_lease(store))}; state in "
                                       f"{store.place}")

        try:
            listed = await asyncio.to_thread(read)
        except Exception as exc:  # noqa: BLE001 - shown on screen; r tries again
            listed = ManagedListed(self.runs, "controller: unknown",
                                   f"could not read the controller's store: {one_line(exc)}; r tries again")
        self.post_message(listed)

    def on_managed_listed(self, message: ManagedListed) -> None:
        self.listings += 1
        self.runs = message.runs
        self.query_one("#controller", Static).update(message.controller)
        table: DataTable[str] = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        for run in self.runs:
            table.add_row(*managed_row(run), key=run.id)
        if self.runs:
            table.move_cursor(row=min(row, len(self.runs) - 1))
        self._show_selected()
        count = len(self.runs)
        text = message.problem or (
            f"{count} managed run{'s' if count != 1 else ''} · x cancels the highlighted one" if count
            else "no managed runs yet: hand one over with `tpu-console launch NODE --managed ...`")
        self.query_one("#status", Static).update(text)

    def _current(self) -> ManagedRun | None:
        table: DataTable[str] = self.query_one(DataTable)
        if not self.runs or table.cursor_row < 0 or table.cursor_row >= len(self.runs):
            return None
        return self.runs[table.cursor_row]

    def _show_selected(self) -> None:
        run = self._current()
        shown = "" if run is None else "\n".join(incarnation_lines(run))
        self.query_one("#incarnations", Static).update(shown)

    def on_data_table_row_highlighted(self, _message: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def action_cancel_run(self) -> None:
        run = self._current()
        if run is None:
            return
        if run.state.terminal:
            self.notify(f"{run.id} has already ended ({run.status.lower()})", severity="warning")
            return
        question = (f"Cancel managed run {run.id}? Run {run.current.run_id or '-'} is stopped and every node "
                    "and queued request the controller made for it deleted.")
        self.app.push_screen(ConfirmModal(question, "Cancel run"),
                             lambda yes: self.cancel(run.id) if yes else None)

    @work(group="managed-cancel", exit_on_error=False)
    async def cancel(self, managed_id: str) -> None:
        try:
            run = await asyncio.to_thread(st.request_cancel, self._store(), managed_id)
            said = (f"{managed_id} is no longer in the controller's store" if run is None
                    else f"{managed_id} has already ended" if run.state.terminal
                    else f"{managed_id}: cancel asked; the controller stops it at its next pass")
        except Exception as exc:  # noqa: BLE001 - shown on screen
            said = f"could not cancel {managed_id}: {one_line(exc)}"
        self.notify(said)
        self.action_refresh()

    def action_back(self) -> None:
        self.app.pop_screen()
