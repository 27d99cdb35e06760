"""`x` on another person's run: stopped only once its run id is typed back, as `tpu-console stop` asks in
a terminal, with whose it is said first."""

from __future__ import annotations

from typing import ClassVar

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class StopTheirsModal(ModalScreen[bool]):
    DEFAULT_CSS = """
    StopTheirsModal { align: center middle; }
    StopTheirsModal #dialog { width: 72; height: auto; padding: 1 2; border: round $error; background:
    $surface; }
    StopTheirsModal #error { color: $error; height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="stop-theirs.cancel")]

    def __init__(self, run_id: str, whose: str, question: str) -> None:
        super().__init__()
        self.run_id, self.whose, self.question = run_id, whose, question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(f"[b]{escape(self.whose)}'s run[/b] {self.run_id}. {escape(self.question)}\n"
                         "Type its run id to stop it:")
            yield Input(placeholder=f"type {self.run_id} here", id="typed", compact=True)
            yield Static("", id="error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip() == self.run_id:
            self.dismiss(True)
        else:
            self.query_one("#error", Static).update(
                f"the id typed does not match {self.run_id}; type it exactly, or esc to cancel")

    def action_cancel(self) -> None:
        self.dismiss(False)
