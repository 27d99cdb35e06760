"""The runs screen's comparison: the marked runs' summaries side by side, each against the first (A) in
percent, as `tpu-console runs compare` prints them; a change for the better is green, for the worse red."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable


def change_style(change: str, lower_is_better: bool) -> str:
    """`-21.2%` on a step time is better (green); on tokens/s worse (red). `-` or no change: unstyled."""
    if not change.endswith("%") or change.lstrip("+-").rstrip("%") in {"0", "0.0"}:
        return ""
    went_down = change.startswith("-")
    return "green" if went_down == lower_is_better else "red"


class CompareModal(ModalScreen[None]):
    DEFAULT_CSS = """
    CompareModal { align: center middle; }
    CompareModal #dialog { width: 100%; height: auto; max-height: 90%; padding: 0 1; border: round $accent;
                           border-title-style: bold; border-subtitle-color: $text-muted; background:
                           $surface; }
    CompareModal DataTable { height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q", "close", "Close", id="compare.close")]

    def __init__(
        self, headers: tuple[str, ...], cells: list[tuple[str, ...]], lower_is_better: Sequence[bool] = ()
    ) -> None:
        super().__init__()
        self.headers = headers
        self.cells = cells
        self.lower_is_better = list(lower_is_better)  # per row; empty: no colours

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog") as dialog:
            dialog.border_title = "Runs compared: each against A"
            dialog.border_subtitle = "esc closes"
            yield DataTable(id="compare", cursor_type="none", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one("#compare", DataTable)
        table.add_columns(*self.headers)
        for index, row in enumerate(self.cells):
            lower = self.lower_is_better[index] if index < len(self.lower_is_better) else None
            # Columns: METRIC, A, then (value, change) per other run: the changes sit at 3, 5, ...
            table.add_row(
                *(
                    Text(
                        cell,
                        style=change_style(cell, lower)
                        if lower is not None and column >= 3 and column % 2 == 1
                        else "",
                    )
                    for column, cell in enumerate(row)
                )
            )

    def action_close(self) -> None:
        self.dismiss(None)
