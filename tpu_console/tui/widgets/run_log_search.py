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

    def open(self, term: str) -> None:
        self.value = term
        self.add_class("-open")
        # The log's tab may be appearing in this same moment; focus once it is shown.
        self.call_after_refresh(self.focus)

    def action_close(self) -> None:
        self.remove_class("-open")
        self.post_message(self.Closed())
