"""What the create and launch forms share: enter in any field or the first button submits, the other
button or esc cancels, and a problem is shown in the form's `#error` line instead of closing it."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.binding import Binding, BindingType
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

Order = TypeVar("Order")


class FormModal(ModalScreen[Order | None]):
    SUBMIT_ID: ClassVar[str] = "submit"  # the id of the button that submits
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="form.cancel")]

    def submit(self) -> None:
        """Check the form; `dismiss` with the order, or `show_error`."""
        raise NotImplementedError

    def show_error(self, text: str) -> None:
        self.query_one("#error", Static).update(text)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == self.SUBMIT_ID:
            self.submit()
        else:
            self.dismiss(None)

    def on_input_submitted(self, _event: Input.Submitted) -> None:
        self.submit()

    def action_cancel(self) -> None:
        self.dismiss(None)
