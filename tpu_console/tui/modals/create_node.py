"""`c`: the create form. Everything that can be checked here (name, type for the provider, zones) is,
before anything is asked of a provider; the create itself then runs in the background with its zone
attempts and state timeline in the operations log."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Select, Static

from tpu_console.errors import UserError
from tpu_console.model import CreateRequest, validate_node_name
from tpu_console.tui.modals.form import FormModal


@dataclass(frozen=True)
class CreateOrder:
    provider: str
    request: CreateRequest


def check_type(provider: str, accelerator_type: str) -> None:
    """UserError when the type means nothing to the provider (the same checks `create` makes)."""
    if provider == "local":
        from tpu_console.providers.local.shapes import parse_local_type

        parse_local_type(accelerator_type)
    elif provider == "gcp":
        from tpu_console.providers.gcp.accelerators import shape_for

        shape_for(accelerator_type)
    elif provider == "ssh":
        raise UserError("the ssh provider cannot create nodes; add them under [[ssh.nodes]] in config.toml")
    # any other provider checks its types itself when asked to create


class CreateNodeModal(FormModal[CreateOrder]):
    SUBMIT_ID = "create"
    DEFAULT_CSS = """
    CreateNodeModal { align: center middle; }
    CreateNodeModal #dialog { width: 76; height: auto; max-height: 100%; overflow-y: auto; padding: 1 2;
    border: round $accent; background: $surface; }
    CreateNodeModal Label { margin-top: 1; color: $text-muted; }
    CreateNodeModal #error { color: $error; height: auto; margin-top: 1; }
    CreateNodeModal #buttons { height: auto; margin-top: 1; }
    CreateNodeModal #buttons Static { width: 2; }
    """

    def __init__(
        self,
        providers: list[str],
        default_provider: str,
        zones: list[str],
        taken: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.taken = taken or {}  # names already listed -> their provider (names are unique across providers)
        self.providers = [p for p in providers if p != "ssh"] or providers
        self.default_provider = default_provider if default_provider in self.providers else self.providers[0]
        self.zones = zones

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static("[b]Create a node[/b]")
            yield Label("Name")
            yield Input(placeholder="grpo-v6e-16", id="name", compact=True)
            yield Label("Provider")
            yield Select(
                [(p, p) for p in self.providers],
                value=self.default_provider,
                allow_blank=False,
                id="provider",
                compact=True,
            )
            yield Label("Type (v6e-16, v4-16, ... for gcp; local-2x4, local-v6e-16 for local)")
            yield Input(placeholder="local-2x2", id="type", compact=True)
            yield Label("Zones to try, in order (gcp)")
            yield Input(
                value=",".join(self.zones), placeholder="europe-west4-a,us-east5-b", id="zones", compact=True
            )
            yield Checkbox("Spot (cheaper, may be preempted)", value=True, id="spot", compact=True)
            yield Static("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Create", variant="primary", id="create", compact=True)
                yield Static("  ")
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def on_mount(self) -> None:
        self._fit_to(self.default_provider)

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "provider":
            self._fit_to(str(event.value))

    def _fit_to(self, provider: str) -> None:
        # Zones mean something to gcp only; the type's example follows the provider picked.
        self.query_one("#zones", Input).disabled = provider != "gcp"
        self.query_one("#type", Input).placeholder = "v6e-16" if provider == "gcp" else "local-2x2"

    def submit(self) -> None:
        name = self.query_one("#name", Input).value.strip()
        accelerator_type = self.query_one("#type", Input).value.strip()
        provider = str(self.query_one("#provider", Select).value)
        zones = tuple(z.strip() for z in self.query_one("#zones", Input).value.split(",") if z.strip())
        problem = validate_node_name(name) if name else "give the node a name"
        if problem is None and name in self.taken:
            problem = f"a {self.taken[name]} node named {name!r} already exists; pick another name"
        if problem is None and not accelerator_type:
            problem = "give an accelerator type, e.g. local-2x2 or v6e-16"
        if problem is None:
            try:
                check_type(provider, accelerator_type)
            except UserError as exc:
                problem = str(exc)
        if problem is None and provider == "gcp" and not zones:
            problem = "give at least one zone to try (gcp.zones in config.toml sets the default)"
        if problem:
            self.show_error(problem)
            return
        spot = self.query_one("#spot", Checkbox).value
        self.dismiss(
            CreateOrder(
                provider,
                CreateRequest(
                    name=name,
                    accelerator_type=accelerator_type,
                    zones=zones if provider == "gcp" else (),
                    spot=spot,
                    queued=provider == "gcp",  # waits for capacity where the type allows (v5e, v5p, v6e)
                ),
            )
        )
