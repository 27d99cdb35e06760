"""The Textual app: owns the providers and opens the nodes screen. Screens hold the behaviour.

    screens/   nodes_screen (the first screen), runs_screen (history, compare), run_screen (one run live)
    modals/    help, create_node, delete_node, launch, confirm, compare
    widgets/   operations_log, and the run dashboard's panels
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen

from tpu_console.providers.base import Provider
from tpu_console.providers.registry import close_providers
from tpu_console.runs.store import RunStore
from tpu_console.tui.modals.help import HelpScreen
from tpu_console.tui.screens.nodes_screen import ConsoleOptions, NodesScreen


def local_now() -> datetime:
    return datetime.now().astimezone()


class TpuConsoleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "tpu-console"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?", id="app.help"),
        Binding("R", "runs", "Runs", key_display="R", id="app.runs"),
        Binding("q", "quit", "Quit", id="app.quit"),
    ]

    def __init__(
        self,
        providers: dict[str, Provider],
        *,
        refresh_every: float = 15.0,
        clock: Callable[[], datetime] = local_now,
        store: RunStore | None = None,
        options: ConsoleOptions | None = None,
    ) -> None:
        super().__init__()
        self.providers = providers
        self.refresh_every = refresh_every
        self.clock = clock  # injectable so tests (and snapshots) see a fixed time
        self.store = store
        self.options = options or ConsoleOptions()

    def get_default_screen(self) -> Screen:
        return NodesScreen(self.providers, refresh_every=self.refresh_every, clock=self.clock, store=self.store,
                           options=self.options)

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

    def action_runs(self) -> None:
        from tpu_console.tui.screens.runs_screen import RunsScreen

        if not isinstance(self.screen, RunsScreen):
            self.push_screen(RunsScreen(self.providers, store=self.store, clock=self.clock))

    async def on_unmount(self) -> None:
        await close_providers(self.providers)
