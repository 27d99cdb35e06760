"""The first screen: every configured provider's nodes in one table, refreshed in the background."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from tpu_console import actions
from tpu_console.node_table import COLUMNS, node_row
from tpu_console.providers.base import Provider


class NodesScreen(Screen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("r", "refresh", "Refresh")]

    def __init__(
        self, providers: dict[str, Provider], *, refresh_every: float, clock: Callable[[], datetime]
    ) -> None:
        super().__init__()
        self.providers = providers
        self.refresh_every = refresh_every
        self.clock = clock
        self.refreshes = 0  # completed refreshes; tests and the status line read it
        self._refreshing = False
        self._problems: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="nodes", cursor_type="row", zebra_stripes=True)
        yield Static("loading nodes...", id="status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#nodes", DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column)
        self.action_refresh()
        self.set_interval(self.refresh_every, self.action_refresh)

    def action_refresh(self) -> None:
        # A slow provider (gcp across many zones) must not pile up listings; one at a time.
        if self._refreshing:
            return
        self._refreshing = True
        self.query_one("#status", Static).update("refreshing...")
        self.run_worker(self._refresh(), group="refresh", exit_on_error=False)

    async def _refresh(self) -> None:
        try:
            listing = await actions.list_nodes(self.providers)
        except Exception as exc:  # noqa: BLE001 - shown on screen; the next refresh may succeed
            listing = actions.NodeList(problems=[f"listing failed: {exc}"])
        finally:
            self._refreshing = False
        self.refreshes += 1
        self._show(listing)

    def _show(self, listing: actions.NodeList) -> None:
        table = self.query_one("#nodes", DataTable)
        now = self.clock()
        selected = self._selected_key(table)
        table.clear()
        for node in listing.nodes:
            table.add_row(*node_row(node, now), key=f"{node.provider}/{node.name}")
        if selected is not None and selected in table.rows:
            table.move_cursor(row=table.get_row_index(selected))
        self.query_one("#status", Static).update(self._status_text(listing, now))
        new_problems = [p for p in listing.problems if p not in self._problems]
        for problem in new_problems:
            self.notify(problem, title="provider problem", severity="warning")
        self._problems = listing.problems

    def _status_text(self, listing: actions.NodeList, now: datetime) -> str:
        count = len(listing.nodes)
        if count:
            summary = f"{count} node{'s' if count != 1 else ''}"
        else:
            summary = "no nodes (make one: tpu-console create NAME --type TYPE)"
        text = f"{summary} · updated {now:%H:%M:%S}"
        if listing.problems:
            # The first problem stays readable here after its notification has faded.
            more = len(listing.problems) - 1
            text += f" · [b]problem:[/b] {listing.problems[0]}" + (f" (+{more} more)" if more else "")
        return text

    @staticmethod
    def _selected_key(table: DataTable) -> str | None:
        if table.row_count == 0:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - no valid cursor yet
            return None
