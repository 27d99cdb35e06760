"""The runs screen's comparison: the selected runs' summaries side by side, B vs A in percent, as
`tpu-console runs compare` prints them."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static


class CompareModal(ModalScreen[None]):
    DEFAULT_CSS = """
    CompareModal { align: center middle; }
    CompareModal #dialog { width: 96%; height: auto; max-height: 90%; padding: 1 2; border: round $accent;
                           background: $surface; }
    CompareModal DataTable { height: auto; }
    CompareModal #hint { color: $text-muted; margin-top: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Close", id="compare.close")]

    def __init__(self, headers: tuple[str, ...], cells: list[tuple[str, ...]]) -> None:
        super().__init__()
        self.headers = headers
        self.cells = cells

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static("[b]Runs compared[/b] (B vs A: change against the first run)")
            yield DataTable(id="compare", cursor_type="none", zebra_stripes=True)
            yield Static("esc closes", id="hint")

    def on_mount(self) -> None:
        table = self.query_one("#compare", DataTable)
        table.add_columns(*self.headers)
        for row in self.cells:
            table.add_row(*row)

    def action_close(self) -> None:
        self.dismiss(None)
