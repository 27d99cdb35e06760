"""The Textual app: owns the providers and opens the nodes screen. Screens hold the behaviour.

    screens/   nodes_screen (the first screen), runs_screen (history, compare), run_screen (one run live),
               managed_screen (managed runs: the controller, incarnations, recoveries)
    modals/    help, create_node, delete_node, sync, launch, confirm, compare (form: what the forms share)
    widgets/   node_table, operations_log, history_table, and the run dashboard's panels
    nodes_feed.py, run_feed.py   what the screens show, gathered by their background workers
    messages.py                  the typed messages between those workers and the screens
    keymap.py                    [keys] in config.toml: bindings remapped by id
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import datetime
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen

from tpu_console.history.store import RunStore
from tpu_console.providers.base import Provider
from tpu_console.providers.registry import close_providers
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.modals.help import HelpScreen
from tpu_console.tui.options import ConsoleOptions
from tpu_console.tui.screens.nodes_screen import NodesScreen


def local_now() -> datetime:
    return datetime.now().astimezone()


class TpuConsoleApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "tpu-console"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "Help", key_display="?", id="app.help",
                tooltip="the keys of this screen"),
        Binding("R", "runs", "Runs", key_display="R", id="app.runs",
                tooltip="the run history: mark runs and compare them"),
        Binding("M", "managed", "Managed", key_display="M", id="app.managed", show=False,
                tooltip="managed runs: the controller, each run's incarnations and recoveries"),
        Binding("q", "quit", "Quit", id="app.quit", tooltip="leave (running jobs and nodes carry on)"),
    ]

    def __init__(
        self,
        providers: dict[str, Provider],
        *,
        refresh_every: float = 15.0,
        clock: Callable[[], datetime] = local_now,
        store: RunStore | None = None,
        options: ConsoleOptions | None = None,
        keymap: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        if keymap:
            # binding id -> keys, e.g. {"nodes.create": "n", "runs.compare": "C"}: every binding has an id.
            self.set_keymap(keymap)
        self.providers = providers
        self.refresh_every = refresh_every
        self.clock = clock  # injectable so tests (and snapshots) see a fixed time
        self.store = store
        self.options = options or ConsoleOptions()

    def get_default_screen(self) -> Screen:
        return NodesScreen(
            self.providers,
            refresh_every=self.refresh_every,
            clock=self.clock,
            store=self.store,
            options=self.options,
        )

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        # Built from what is bound right now (a remapped key included), so help never disagrees with the
        # keys; hidden bindings with a tooltip (esc clears the filter) are worth listing too.
        keys: dict[str, tuple[str, str, str]] = {}  # action -> (key, name, what it does)
        for key, active in self.screen.active_bindings.items():
            binding = active.binding
            if not binding.description or not (binding.show or binding.tooltip):
                continue
            if binding.action in keys and not binding.id:
                continue  # Textual's own ctrl+q beside our q: one line per action, ours
            shown = binding.key_display or self.get_key_display(binding.with_key(key))
            keys[binding.action] = (shown, binding.description, binding.tooltip)
        self.push_screen(HelpScreen(list(keys.values()), getattr(self.screen, "HELP_TITLE", "Keys")))

    def action_runs(self) -> None:
        from tpu_console.tui.screens.runs_screen import RunsScreen

        if not isinstance(self.screen, RunsScreen):
            self.push_screen(RunsScreen(self.providers, store=self.store, clock=self.clock))

    def action_managed(self) -> None:
        from tpu_console.tui.screens.managed_screen import ManagedScreen

        if not isinstance(self.screen, ManagedScreen):
            self.push_screen(ManagedScreen())

    async def action_quit(self) -> None:
        # Quitting cancels the operations under way where they stand (a create half done, a sync on some
        # workers): say which, and ask first.
        running = [
            op for screen in self.screen_stack if isinstance(screen, NodesScreen) for op in screen.running
        ]
        if not running:
            self.exit()
            return
        if isinstance(self.screen, ConfirmModal):
            return
        queued = {label: worker for screen in self.screen_stack if isinstance(screen, NodesScreen)
                  for label, worker in screen.queued_creates.items()}
        question = (
            f"{len(running)} operation(s) still under way ({', '.join(running)}). Quit anyway? They stop "
            "where they are; nodes and launched jobs stay as they are."
        )
        if queued:  # no queued request is left behind silently
            question += (f" The queued request(s) of {', '.join(queued)} are deleted first, and their "
                         "deletion confirmed.")

        def answer(yes: bool | None) -> None:
            if yes and queued:
                self.run_worker(self._cancel_then_exit(list(queued.values())), exclusive=False)
            elif yes:
                self.exit()

        self.push_screen(ConfirmModal(question, "Quit"), answer)

    async def _cancel_then_exit(self, creates: list) -> None:
        """Cancel the queued creates (each deletes its request and waits until it is gone), then quit."""
        for worker in creates:
            worker.cancel()
        for worker in creates:
            with contextlib.suppress(Exception):
                await worker.wait()
        self.exit()

    async def on_unmount(self) -> None:
        await close_providers(self.providers)
