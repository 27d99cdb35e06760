"""The nodes screen's operations panel: every long operation (create, delete, bootstrap, sync, launch,
stop) writes its progress here, one line per step and per worker, while the person keeps working."""

from __future__ import annotations

from datetime import datetime

from rich.markup import escape
from textual.widgets import RichLog


class OperationsLog(RichLog):
    DEFAULT_CSS = """
    OperationsLog { height: 9; border-top: solid $panel-lighten-2; padding: 0 1; }
    """

    def __init__(self, clock=datetime.now, **kwargs) -> None:
        super().__init__(max_lines=2000, wrap=True, markup=True, highlight=False, **kwargs)
        self.clock = clock
        self.lines_written: list[str] = []  # plain text, for tests and for copying out

    def say(self, operation: str, text: str, style: str = "") -> None:
        plain = f"{operation}: {text}"
        self.lines_written.append(plain)
        body = escape(text)
        self.write(f"[dim]{self.clock():%H:%M:%S}[/dim] [b]{escape(operation)}[/b] "
                   + (f"[{style}]{body}[/{style}]" if style else body))
