"""What the create, sync and launch forms share: enter in any field (a text field, a list, the first
button) submits, ctrl+s submits from anywhere, the other button or esc cancels, and a problem is shown in
the form's `#error` line instead of closing it. Hints in empty fields read "e.g. ..." and are dim
(Textual's placeholder style); a real default is filled in as a value. A tick box reads without colour:
`▐X▌` ticked, `▐ ▌` not (Textual's Checkbox draws X both ways, told apart by colour alone)."""

from __future__ import annotations

from typing import ClassVar, TypeVar

from textual.binding import Binding, BindingType
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Select, Static

Order = TypeVar("Order")


class FormSelect(Select, inherit_bindings=False):
    """A list whose choices open with space or the arrows, so that enter submits the form here too."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("down,space,up", "show_overlay", "Show choices", show=False, id="form.choices"),
    ]


class TickBox(Checkbox):
    """A checkbox whose mark is there only when ticked, so its state reads in any terminal, colour or not
    (a screen reader's text, a capture, a colour-blind eye)."""

    TICKED, UNTICKED = "X", " "

    @property
    def _button(self) -> Content:
        self.BUTTON_INNER = self.TICKED if self.value else self.UNTICKED
        return super()._button


KEYS_HINT = "enter or ctrl+s submits"  # shown beside each form's buttons (class `keys-hint`)


class FormModal(ModalScreen[Order | None]):
    DEFAULT_CSS = """
    FormModal #buttons .keys-hint { width: auto; color: $text-muted; margin-left: 3; }
    """
    SUBMIT_ID: ClassVar[str] = "submit"  # the id of the button that submits
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="form.cancel"),
        Binding("ctrl+s", "submit", "Submit", priority=True, id="form.submit"),
        # enter where no field takes it (a closed list): the form's own answer
        Binding("enter", "submit", "Submit", show=False, id="form.enter"),
    ]

    def submit(self) -> None:
        """Check the form; `dismiss` with the order, or `show_error`."""
        raise NotImplementedError

    def action_submit(self) -> None:
        self.submit()

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
