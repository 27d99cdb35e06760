"""The Textual app: owns the providers and opens the nodes screen. Screens hold the behaviour."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen

from tpu_console.providers.base import Provider
from tpu_console.providers.registry import close_providers
from tpu_console.tui.help_screen import HelpScreen
from tpu_console.tui.nodes_screen import NodesScreen


def local_now() -> datetime:
    return datetime.now().astimezone()


class TpuConsoleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "tpu-console"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        providers: dict[str, Provider],
        *,
        refresh_every: float = 15.0,
        clock: Callable[[], datetime] = local_now,
    ) -> None:
        super().__init__()
        self.providers = providers
        self.refresh_every = refresh_every
        self.clock = clock  # injectable so tests (and snapshots) see a fixed time

    def get_default_screen(self) -> Screen:
        return NodesScreen(self.providers, refresh_every=self.refresh_every, clock=self.clock)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        # Built from what is bound right now, so the help never disagrees with the keys.
        keys = [
            (active.binding.key_display or self.get_key_display(active.binding), active.binding.description)
            for active in self.screen.active_bindings.values()
            if active.binding.show and active.binding.description
        ]
        self.push_screen(HelpScreen(keys))

    async def on_unmount(self) -> None:
        await close_providers(self.providers)
