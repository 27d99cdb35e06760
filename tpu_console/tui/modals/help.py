"""The `?` dialog: the keys that work on the screen it was opened from."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen #help-dialog { width: auto; min-width: 30; height: auto; padding: 1 2; border: round $accent;
                              background: $surface; }
    HelpScreen #help-title { text-style: bold; margin-bottom: 1; }
    HelpScreen #help-hint { margin-top: 1; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close", id="help.close"),
        Binding("question_mark", "dismiss", "Close", show=False, id="help.close_question"),
        Binding("q", "dismiss", "Close", show=False, id="help.close_q"),
    ]

    def __init__(self, keys: list[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = keys

    def compose(self) -> ComposeResult:
        width = max((len(key) for key, _ in self.keys), default=1)
        lines = [f"[b]{key.ljust(width)}[/b]  {description}" for key, description in self.keys]
        with Vertical(id="help-dialog"):
            yield Static("Keys", id="help-title")
            yield Static("\n".join(lines), id="help-keys")
            yield Static("esc closes this help", id="help-hint")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
