"""`c`: the create form. Everything that can be checked here (name, type for the provider, zones) is,
before anything is asked of a provider; the create itself then runs in the background with its zone
attempts and state timeline in the operations log. On gcp it offers what `create`'s flags do (the
provisioning, a wait-for, `auto` zones, race, direct), read by the same functions (create_options)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Checkbox, Input, Label, Static

from tpu_console.domain import CreateRequest, validate_node_name
from tpu_console.errors import UserError
from tpu_console.providers import create_options
from tpu_console.tui.modals.form import KEYS_HINT, FormModal, FormSelect, TickBox

# The type `c` offers for each provider: a local pod the tiny demo runs on with two CPU cores, and the
# smallest v6e slice the shipped configs plan for.
DEFAULT_TYPES = {"local": "local-2x2", "gcp": "v6e-8"}


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


def free_name(taken: dict[str, str], base: str = "demo") -> str:
    """`demo`, else `demo-2`, `demo-3` ...: a name no listed node has."""
    n, name = 1, base
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


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
    CreateNodeModal #gcp { height: auto; }
    CreateNodeModal .row { height: auto; margin-top: 1; }
    CreateNodeModal .row Label { margin: 0 1 0 0; width: auto; }
    CreateNodeModal #provisioning { width: 18; }
    CreateNodeModal #reservation, CreateNodeModal #wait_for { width: 1fr; }
    CreateNodeModal .row Checkbox { margin-right: 3; }
    """

    def __init__(
        self,
        providers: list[str],
        default_provider: str,
        zones: list[str],
        taken: dict[str, str] | None = None,
        project: str | None = None,
    ) -> None:
        super().__init__()
        self.taken = taken or {}  # names already listed -> their provider (names are unique across providers)
        self.providers = [p for p in providers if p != "ssh"] or providers
        self.default_provider = default_provider if default_provider in self.providers else self.providers[0]
        self.zones = zones
        self.project = project  # whose capacity record `auto` zones are ordered by

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static("[b]Create a node[/b]")
            yield Label("Name")
            yield Input(value=free_name(self.taken), placeholder="e.g. grpo-v6e-16", id="name", compact=True)
            yield Label("Provider")
            yield FormSelect(
                [(p, p) for p in self.providers],
                value=self.default_provider,
                allow_blank=False,
                id="provider",
                compact=True,
            )
            yield Label("Type (v6e-16, v4-16, ... for gcp; local-2x4, local-v6e-16 for local)")
            yield Input(value=DEFAULT_TYPES.get(self.default_provider, ""), id="type", compact=True)
            yield Label("Zones to try, in order, or auto: by the capacity record (gcp)")
            yield Input(
                value=",".join(self.zones), placeholder="e.g. europe-west4-a,us-east5-b or auto", id="zones",
                compact=True
            )
            yield TickBox("Spot (cheaper, may be preempted)", value=True, id="spot", compact=True)
            with Vertical(id="gcp"):  # `create`'s gcp flags; shown for gcp only
                with Horizontal(classes="row"):
                    yield Label("Capacity")
                    yield FormSelect(
                        [(p, p) for p in create_options.PROVISIONING],
                        value="spot",
                        allow_blank=False,
                        id="provisioning",
                        compact=True,
                    )
                    yield Label(" Reservation")
                    yield Input(placeholder="e.g. my-reservation", id="reservation", compact=True)
                with Horizontal(classes="row"):
                    yield Label("Wait for")
                    yield Input(placeholder="e.g. 2h, 45m, 1h30m (empty: until deleted)", id="wait_for",
                                compact=True)
                with Horizontal(classes="row"):
                    yield TickBox("Race the zones", id="race", compact=True)
                    yield TickBox("Direct (Create Node API, no queue)", id="direct", compact=True)
            yield Static("", id="error")
            with Horizontal(id="buttons"):
                yield Button("Create", variant="primary", id="create", compact=True)
                yield Static("  ")
                yield Button("Cancel (esc)", id="cancel", compact=True)
                yield Static(KEYS_HINT, classes="keys-hint")

    def on_mount(self) -> None:
        self._fit_to(self.default_provider)

    def on_select_changed(self, event: FormSelect.Changed) -> None:
        if event.select.id == "provider":
            self._fit_to(str(event.value))
        elif event.select.id == "provisioning":
            self.query_one("#reservation", Input).disabled = event.value != "reservation"

    def _fit_to(self, provider: str) -> None:
        # Zones and the queued request's options mean something to gcp only (where the provisioning list
        # stands for the spot box); the type follows the provider picked, unless one was typed.
        self.query_one("#zones", Input).disabled = provider != "gcp"
        self.query_one("#gcp").display = provider == "gcp"
        self.query_one("#spot").display = provider != "gcp"
        provisioning = self.query_one("#provisioning", FormSelect).value
        self.query_one("#reservation", Input).disabled = provisioning != "reservation"
        field = self.query_one("#type", Input)
        if not field.value or field.value in DEFAULT_TYPES.values():
            field.value = DEFAULT_TYPES.get(provider, "")
        field.placeholder = "e.g. v6e-16, v4-16" if provider == "gcp" else "e.g. local-2x4, local-v6e-16"

    def submit(self) -> None:
        name = self.query_one("#name", Input).value.strip()
        accelerator_type = self.query_one("#type", Input).value.strip()
        provider = str(self.query_one("#provider", FormSelect).value)
        zones_text = self.query_one("#zones", Input).value.strip()
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
        request = None
        if problem is None:
            try:
                request = self._request(provider, name, accelerator_type, zones_text)
            except UserError as exc:
                problem = str(exc)
        if problem is None and request is not None and provider == "gcp" and not request.zones:
            problem = "give at least one zone to try (gcp.zones in config.toml sets the default)"
        if problem or request is None:
            self.show_error(problem or "")
            return
        self.dismiss(CreateOrder(provider, request))

    def _request(self, provider: str, name: str, accelerator_type: str, zones_text: str) -> CreateRequest:
        """The request the form describes; UserError (the CLI's line) for a bad gcp option."""
        if provider != "gcp":
            spot = self.query_one("#spot", Checkbox).value
            return CreateRequest(name=name, accelerator_type=accelerator_type, spot=spot)
        provisioning = str(self.query_one("#provisioning", FormSelect).value)
        reservation = self.query_one("#reservation", Input).value.strip() or None
        wait_for = self.query_one("#wait_for", Input).value.strip()
        direct = self.query_one("#direct", Checkbox).value
        race = self.query_one("#race", Checkbox).value
        create_options.check_combination(direct=direct, race=race, provisioning=provisioning,
                                         reservation=reservation)
        # `auto` orders the configured zones; an emptied field stays empty (it opens with them as its value)
        configured = self.zones if create_options.is_auto(zones_text) else []
        return CreateRequest(
            name=name,
            accelerator_type=accelerator_type,
            zones=create_options.parse_zones(zones_text, configured, self.project, accelerator_type),
            spot=provisioning == "spot",
            queued=not direct,  # waits for capacity where the type allows (v5e, v5p, v6e)
            reservation=reservation if provisioning == "reservation" else None,
            best_effort=provisioning == "best-effort",
            valid_for_s=create_options.parse_duration(wait_for) if wait_for else None,
            race=race,
        )
