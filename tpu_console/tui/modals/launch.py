"""`l`: the launch form. The config (a shipped one or a file), its `--set` overrides and the env file are
checked here with the trainer's own schema and against the node's shape, and any problem is shown in the
form; only a config that passes closes it, and only then does anything reach a worker."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from tpu_console.errors import UserError
from tpu_console.model import Node
from tpu_console.runs.launch import check_shape, validate_config
from tpu_console.secrets import read_env_file
from tpu_console.tui.modals.form import FormModal


@dataclass(frozen=True)
class LaunchOrder:
    config_path: str
    overrides: list[str]
    env_file: str | None
    kill_stale: bool
    fail_fast: bool = False


def shipped_configs() -> list[Path]:
    import trainer

    folder = Path(trainer.__file__).parent / "configs"
    return sorted(folder.glob("*.yaml"))


def check_launch(node: Node, config_path: str, overrides: list[str], env_file: str | None) -> None:
    """UserError for anything `launch` would refuse before touching a worker, that can be known here."""
    check_shape(validate_config(config_path, overrides), node, node.shape.workers)
    if env_file:
        read_env_file(env_file)


class LaunchModal(FormModal[LaunchOrder]):
    SUBMIT_ID = "launch"
    DEFAULT_CSS = """
    LaunchModal { align: center middle; }
    LaunchModal #dialog { width: 84; height: auto; max-height: 100%; overflow-y: auto; padding: 1 2; border:
    round $accent; background: $surface; }
    LaunchModal Label { margin-top: 1; color: $text-muted; }
    LaunchModal #error { color: $error; height: auto; margin-top: 1; }
    LaunchModal #buttons { height: auto; margin-top: 1; }
    LaunchModal #buttons Static { width: 2; }
    LaunchModal #flags { height: 1; margin-top: 1; }
    LaunchModal #flags Checkbox { margin-right: 3; }
    """

    def __init__(self, node: Node) -> None:
        super().__init__()
        self.node = node
        self.configs = shipped_configs()

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(
                f"[b]Launch the trainer on {self.node.name}[/b] ({self.node.accelerator_type}, "
                f"{self.node.shape.workers} workers x {self.node.shape.devices_per_worker} devices)"
            )
            yield Label("Shipped config")
            yield Select(
                [(p.name, str(p)) for p in self.configs],
                value=self._default_config(),
                id="shipped",
                compact=True,
            )
            yield Label("...or a config file (wins when given)")
            yield Input(placeholder="path/to/config.yaml", id="path", compact=True)
            yield Label("Overrides: KEY=VALUE separated by spaces (e.g. steps=20 rollout.n=8)")
            yield Input(placeholder="steps=20", id="overrides", compact=True)
            yield Label("Env file with secrets (optional; else the one `sync` uploaded)")
            yield Input(placeholder=".env", id="env", compact=True)
            with Horizontal(id="flags"):
                yield Checkbox("Kill stale TPU holders first", id="kill-stale", compact=True)
                yield Checkbox("Fail fast: stop all when one fails", id="fail-fast", compact=True)
            yield Static("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Launch", variant="primary", id="launch", compact=True)
                yield Static("  ")
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def _default_config(self) -> str | object:
        # A local pod cannot hold the real model: offer the tiny config there, the first shipped one
        # elsewhere.
        if not self.configs:
            return Select.BLANK
        tiny = [p for p in self.configs if p.name == "tiny_local.yaml"]
        return str(tiny[0] if tiny and self.node.provider == "local" else self.configs[0])

    def submit(self) -> None:
        path = self.query_one("#path", Input).value.strip()
        shipped = self.query_one("#shipped", Select).value
        config = path or ("" if shipped is Select.BLANK else str(shipped))
        overrides = self.query_one("#overrides", Input).value.split()
        env_file = self.query_one("#env", Input).value.strip() or None
        try:
            if not config:
                raise UserError("pick a shipped config or give a config file")
            check_launch(self.node, config, overrides, env_file)
        except UserError as exc:
            self.show_error(str(exc))
            return
        self.dismiss(
            LaunchOrder(
                config,
                overrides,
                env_file,
                self.query_one("#kill-stale", Checkbox).value,
                self.query_one("#fail-fast", Checkbox).value,
            )
        )
