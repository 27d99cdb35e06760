"""Every tick box of the forms reads without colour: `▐X▌` ticked, `▐ ▌` not (Textual's own Checkbox draws
`▐X▌` both ways, told apart by colour alone), and space flips what is drawn."""

from __future__ import annotations

import pytest
from textual.widgets import Checkbox

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.form import TickBox

# The launch form plans its config (the stubbed `planner`): the real one compiled the 3B config in the
# background for minutes after this test ended.
pytestmark = pytest.mark.usefixtures("console_home", "planner")


def drawn(box: Checkbox) -> str:
    """The box's first cells as a terminal without colour shows them."""
    return box.render().plain[:3]


@pytest.mark.parametrize("form_key", ["l", "c"])
async def test_every_tick_box_of_a_form_shows_its_state_without_colour(form_key):
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        for _ in range(300):
            if app.screen.refreshes:
                break
            await pilot.pause(0.01)
        await pilot.press(form_key)
        boxes = list(app.screen.query(Checkbox))
        assert boxes, "the form has no tick box"
        for box in boxes:
            assert isinstance(box, TickBox), f"{box.id} is a plain Checkbox: its state shows by colour only"
            assert drawn(box) == ("▐X▌" if box.value else "▐ ▌")
            before = box.value
            box.focus()
            await pilot.press("space")
            assert box.value is not before
            assert drawn(box) == ("▐X▌" if box.value else "▐ ▌")
