"""The `/` prompt of the log pane: type a term, enter searches, escape closes (as in toolong and k9s)."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Input


class LogSearch(Input):
    DEFAULT_CSS = """
    LogSearch {
        display: none;
        height: 3;
        border: tall $accent;
    }
    LogSearch.-open {
        display: block;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close search", id="run.search.close"),
    ]

    class Closed(Message):
        """The prompt was closed (escape, or enter after searching)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(placeholder="search the log (enter: find, esc: close)", **kwargs)

    def open(self, term: str, shown: bool = True) -> None:
        """Show the prompt with `term`; `shown`: the log's tab is already on screen (else it is appearing
        in this same moment, and the prompt can take the focus only once it is drawn)."""
        self.value = term
        self.add_class("-open")
        if shown:
            self.focus()
        else:
            self.call_after_refresh(self.focus)

    def action_close(self) -> None:
        self.remove_class("-open")
        self.post_message(self.Closed())
