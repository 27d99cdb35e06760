"""`s`: the sync form. This checkout (uncommitted changes too) as a wheel, or a git branch, installed on every
worker, and an env file uploaded beside it at mode 0600. The env file is read and the git pair checked here,
so a missing file or a URL without its branch stays in the form and nothing is sent."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Static

from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.secrets import read_env_file
from tpu_console.tui.modals.form import KEYS_HINT, FormModal


@dataclass(frozen=True)
class SyncOrder:
    env_file: str | None
    git_url: str | None = None
    branch: str | None = None


class SyncModal(FormModal[SyncOrder]):
    SUBMIT_ID = "sync"
    DEFAULT_CSS = """
    SyncModal { align: center middle; }
    SyncModal #dialog { width: 84; height: auto; max-height: 100%; overflow-y: auto; padding: 1 2; border:
    round $accent; background: $surface; }
    SyncModal Label { margin-top: 1; color: $text-muted; }
    SyncModal #error { color: $error; height: auto; margin-top: 1; }
    SyncModal #buttons { height: auto; margin-top: 1; }
    SyncModal #buttons Static { width: 2; }
    SyncModal #git-fields { height: 1; }
    SyncModal #git-fields Static { width: 2; }
    SyncModal #git-url { width: 1fr; }
    SyncModal #branch { width: 20; }
    """

    def __init__(self, node: Node, env_file: str | None) -> None:
        super().__init__()
        self.node = node
        self.env_file = env_file  # ./.env when there is one

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(
                f"[b]Sync the code to {self.node.name}[/b] ({self.node.shape.workers} workers): this "
                "checkout as a wheel, uncommitted changes included"
            )
            yield Label("Env file with secrets, uploaded as ~/tpu-console/.env (mode 0600); empty: none")
            yield Input(value=self.env_file or "", placeholder="none (e.g. .env)", id="env", compact=True)
            yield Label("...or install a git branch instead of this checkout: repository URL, branch")
            with Horizontal(id="git-fields"):
                yield Input(
                    placeholder="e.g. https://github.com/me/tpu-console.git", id="git-url", compact=True
                )
                yield Static("  ")
                yield Input(placeholder="e.g. main", id="branch", compact=True)
            yield Static("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Sync", variant="primary", id="sync", compact=True)
                yield Static("  ")
                yield Button("Cancel (esc)", id="cancel", compact=True)
                yield Static(KEYS_HINT, classes="keys-hint")

    def submit(self) -> None:
        env_file = self.query_one("#env", Input).value.strip() or None
        git_url = self.query_one("#git-url", Input).value.strip() or None
        branch = self.query_one("#branch", Input).value.strip() or None
        try:
            if (git_url is None) != (branch is None):
                raise UserError(
                    "a git URL and its branch go together: give both, or neither to sync this checkout"
                )
            if env_file:
                read_env_file(env_file)
        except UserError as exc:
            self.show_error(str(exc))
            return
        self.dismiss(SyncOrder(env_file, git_url, branch))
