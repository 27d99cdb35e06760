"""A message read whole: the run's first failure (`e`) or a worker's last error (`enter`), wrapped to the
dialog's width and scrollable, where the header and the grid have room for one line of it. Esc, enter or
q closes it."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class FullTextModal(ModalScreen[None]):
    DEFAULT_CSS = """
    FullTextModal { align: center middle; }
    FullTextModal #dialog { width: 90%; max-width: 110; height: auto; max-height: 90%; padding: 0 1;
    border: round $error; background: $surface; }
    FullTextModal #title { text-style: bold; margin-bottom: 1; }
    FullTextModal VerticalScroll { height: auto; max-height: 20; }
    FullTextModal #body { width: 1fr; }
    FullTextModal #hint { color: $text-muted; margin-top: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter,q", "close", "Close", id="full_text.close"),
    ]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(Text(self.title_text), id="title")
            with VerticalScroll():
                yield Static(Text(self.body), id="body")  # Text: brackets in an error are not markup
            yield Static("esc closes", id="hint")

    def action_close(self) -> None:
        self.dismiss(None)
