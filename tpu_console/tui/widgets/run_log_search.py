"""The `/` prompt of the log pane: type a term, enter searches, escape closes (as in toolong and k9s).

The prompt takes the focus in the same moment `/` is handled (`Screen.set_focus`, not `focus()`, which
waits for the app's queue, nor after a refresh): keys typed right after `/` already go to the prompt, from
whichever tab it was pressed on. The screen's `/` binding has priority so that it runs as the app reads
the key, before the next key is routed."""

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
        """Show the prompt with `term` and give it the focus now."""
        self.value = term
        self.add_class("-open")
        self.screen.set_focus(self)

    def action_close(self) -> None:
        self.remove_class("-open")
        self.post_message(self.Closed())
