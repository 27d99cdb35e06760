"""`t` on the run dashboard: where the run is stuck, every worker's Python stacks grouped (observe/stacks.py);
`escape` closes it, `r` asks again."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tpu_console.errors import one_line


class StacksModal(ModalScreen[None]):
    DEFAULT_CSS = """
    StacksModal { align: center middle; }
    StacksModal #dialog {
        width: 95%; height: 90%; padding: 0 1; border: round $accent; background: $surface;
    }
    StacksModal #stacks-title { text-style: bold; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,t", "dismiss", "Close", id="stacks.close"),
        Binding("r", "refresh", "Ask again", id="stacks.refresh"),
    ]

    def __init__(self, run_id: str, ask: Callable[[], Awaitable[str]]) -> None:
        super().__init__()
        self.run_id = run_id
        self.ask = ask

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(f"Where {self.run_id} is: every worker's Python stacks (r: ask again, esc: close)",
                         id="stacks-title")
            with VerticalScroll():
                yield Static("asking every worker's job (SIGUSR1)...", id="stacks", markup=False)

    def on_mount(self) -> None:
        self._collect()

    def action_refresh(self) -> None:
        self.query_one("#stacks", Static).update("asking every worker's job (SIGUSR1)...")
        self._collect()

    @work(exclusive=True, group="stacks", exit_on_error=False)
    async def _collect(self) -> None:
        try:
            text = await self.ask()
        except Exception as exc:  # noqa: BLE001 - shown in the dialog
            text = f"could not collect the stacks: {one_line(exc)}"
        self.query_one("#stacks", Static).update(text)
