"""`d`: delete a node only once its name is typed back, as `tpu-console delete` asks in a terminal."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from tpu_console.domain import Node
from tpu_console.views.nodes import type_text


class DeleteNodeModal(ModalScreen[bool]):
    DEFAULT_CSS = """
    DeleteNodeModal { align: center middle; }
    DeleteNodeModal #dialog { width: 72; height: auto; padding: 1 2; border: round $error; background:
    $surface; }
    DeleteNodeModal #error { color: $error; height: auto; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="delete.cancel")]

    def __init__(self, node: Node, cost: str) -> None:
        super().__init__()
        self.node = node
        self.cost = cost

    def compose(self) -> ComposeResult:
        node = self.node
        with Vertical(id="dialog"):
            yield Static(
                f"[b]Delete {node.provider} node {node.name}[/b] ({type_text(node)}, "
                f"{node.shape.workers} workers, cost so far {self.cost})?\n"
                "Everything on its workers' disks goes with it. Type its name to confirm:"
            )
            yield Input(placeholder=f"type {node.name} here", id="typed", compact=True)
            yield Static("", id="error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip() == self.node.name:
            self.dismiss(True)
        else:
            self.query_one("#error", Static).update(
                f"the name typed does not match {self.node.name!r}; type it exactly, or esc to cancel"
            )

    def action_cancel(self) -> None:
        self.dismiss(False)
