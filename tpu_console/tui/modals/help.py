"""The `?` dialog: the keys that work on the screen it was opened from, each with what it does."""

from __future__ import annotations

from typing import ClassVar

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

# (key as shown, short name, what it does): the footer's words and the binding's tooltip.
KeyHelp = tuple[str, str, str]


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen #help-dialog { width: 90; max-width: 100%; height: auto; max-height: 90%;
                              padding: 0 2; border: round $accent; border-title-style: bold;
                              border-subtitle-color: $text-muted; background: $surface; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close", id="help.close"),
        Binding("question_mark", "dismiss", "Close", show=False, id="help.close_question"),
        Binding("q", "dismiss", "Close", show=False, id="help.close_q"),
    ]

    def __init__(self, keys: list[KeyHelp], title: str = "Keys") -> None:
        super().__init__()
        self.keys = keys
        self.title_text = title

    def compose(self) -> ComposeResult:
        key_width = max((len(key) for key, _, _ in self.keys), default=1)
        name_width = max((len(name) for _, name, _ in self.keys), default=1)
        lines = [
            f"[b]{escape(key.ljust(key_width))}[/b]  {escape(name.ljust(name_width))}  "
            f"[dim]{escape(detail)}[/dim]"
            for key, name, detail in self.keys
        ]
        with VerticalScroll(id="help-dialog") as dialog:
            dialog.border_title = self.title_text
            dialog.border_subtitle = "esc closes"
            yield Static("\n".join(lines), id="help-keys")

    async def action_dismiss(self, result: None = None) -> None:
        self.dismiss(result)
