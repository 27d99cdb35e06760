"""The nodes screen's table: one row per node of every provider, the state and health in colour, and the
run on it (or how long it has sat idle, and what that cost). It only draws the listing it is given.
The cost so far of each node is `tpu-console ls`'s and the delete dialog's; here the price per hour."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from tpu_console.domain import Node, QueuedRequest
from tpu_console.tui.nodes_feed import NodesListing, node_key
from tpu_console.tui.styles import NODE_STATE_STYLES, RUN_STATE_STYLES
from tpu_console.views.nodes import (
    HOLDS_QUOTA,
    format_age,
    format_price,
    node_row,
    request_row,
    request_state,
    state_cell,
    type_text,
    what_ran,
)

# Every column of `ls` and the run, in 100 columns: the provider shows as the zone it is in (zones are gcp's;
# a local or ssh node has none), health follows the state, spot follows the price.
# W is the number of workers (hosts).
COLUMNS = ("NAME", "WHERE", "TYPE", "W", "STATE", "AGE", "$/HOUR", "RUN")
MIN_LABEL = 12  # a run's label shorter than this says too little: left out
HEALTH_STYLES = {"ok": "green", "timeout": "yellow"}  # anything else the TPU API reports is a problem: red


HEALTH_WORDS = {"HEALTHY": "ok", "TIMEOUT": "timeout", "UNHEALTHY_MAINTENANCE": "maint",
                "UNHEALTHY_TENSORFLOW": "unhealthy"}


def health_word(health: str | None) -> str | None:
    """A short word for the TPU API's health (`ok`, `maint` ...); None where the provider reports none
    (local, ssh)."""
    if not health:
        return None
    return HEALTH_WORDS.get(health, health.lower())


def state_text(node: Node) -> Text:
    text = Text(state_cell(node), style=NODE_STATE_STYLES.get(node.state, ""))
    if (word := health_word(node.health)) is not None:
        text.append(f" {word}", style=HEALTH_STYLES.get(word, "bold red"))
    if node.symptoms:
        text.append(" symptom", style="bold red")
    if node.maintenance is not None:
        text.append(" maint due", style="bold yellow")
    return text


def request_state_text(request: QueuedRequest, now: datetime) -> Text:
    """`WAITING 12m`, `PROVISIONING`, `FAILED: reason`, `SUSPENDED`; red with "holds quota" when it does."""
    if request.state.holds_quota:
        return Text(f"{request_state(request, now)} ({HOLDS_QUOTA})", style="bold red")
    return Text(request_state(request, now), style="yellow" if request.state.waiting else "cyan")


def where_text(node: Node) -> str:
    return node.zone if node.zone and node.zone != node.provider else node.provider


def price_text(node: Node) -> str:
    price = format_price(node)
    if not node.spot:
        return price
    return "spot" if price == "-" else f"{price} spot"


class NodeTable(DataTable):
    # DataTable's own enter (select_cursor) would hide the screen's; rebinding it here names what it does
    # in the footer and in help. Selecting a row posts RowSelected, which the screen turns into "open run".
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Open", key_display="⏎", id="nodes.open_run",
                tooltip="the node's latest run in the run dashboard"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self.shown: list[Node | QueuedRequest] = []

    def on_mount(self) -> None:
        for column in COLUMNS:
            self.add_column(column, key=column)

    def show(self, listing: NodesListing, now: datetime, filter_text: str = "") -> None:
        """Redraw from `listing`, keeping the cursor on the same node; rows that do not contain
        `filter_text` (lower case) in any cell are left out."""
        selected = self.selected()
        self.clear()
        self.shown = []
        rows: list[tuple[Node, list[str | Text]]] = []
        for node in listing.nodes:
            cells = self._cells(node, listing, now)
            # The filter also sees what the cells fold away: the provider, the zone, the health, what ran.
            ran = what_ran(record, 200) if (record := listing.latest_run(node)) is not None else ""
            searched = [*cells, *node_row(node, now), node.health or "", ran]
            if filter_text and not any(filter_text in str(cell).lower() for cell in searched):
                continue
            rows.append((node, cells))
        room = self._run_room([cells for _, cells in rows])
        for node, cells in rows:
            record = listing.latest_run(node)
            if record is not None and listing.idle_since(node) is None:
                # What the run ran, where the screen has room for it (the rest of its width).
                label = what_ran(record, room - len(cells[-1]) - 1)
                if len(label) >= MIN_LABEL:
                    cells[-1] = Text.assemble(cells[-1], (f" {label}", "dim"))
            self.add_row(*cells, key=node_key(node))
            self.shown.append(node)
        for request in listing.requests:  # those with a node show as their node
            if request.has_node:
                continue
            cells = [request.name, request.zone or request.provider, request_row(request, now)[2], "-",
                     request_state_text(request, now), format_age(request.created_at, now),
                     request.provisioning, Text("queued request", style="dim")]
            searched = request_row(request, now)
            if filter_text and not any(filter_text in cell.lower() for cell in searched):
                continue
            self.add_row(*cells, key=request_key(request))
            self.shown.append(request)
        if selected is not None and _key(selected) in self.rows:
            self.move_cursor(row=self.get_row_index(_key(selected)))

    def _run_room(self, rows: list[list[str | Text]]) -> int:
        """How wide the RUN column may grow before the table is wider than the screen."""
        width = self.size.width or self.app.size.width
        others = sum(max(len(header), *(len(str(cells[i])) for cells in rows)) + 2
                     for i, header in enumerate(COLUMNS[:-1])) if rows else 0
        return width - others - 2 - 2  # its own padding, and the scroll bar's place

    def selected(self) -> Node | QueuedRequest | None:
        if not self.shown or not 0 <= self.cursor_row < len(self.shown):
            return None
        return self.shown[self.cursor_row]

    def selected_node(self) -> Node | None:
        item = self.selected()
        return item if isinstance(item, Node) else None

    @staticmethod
    def _cells(node: Node, listing: NodesListing, now: datetime) -> list[str | Text]:
        name: str | Text = node.name
        if node.queued_request:  # made by a queued request (deleting the node deletes it too)
            mark = " ⧗" if node.queued_request == node.name else f" ⧗{node.queued_request}"
            name = Text.assemble(node.name, (mark, "dim"))
        return [name, where_text(node), type_text(node), str(node.shape.workers), state_text(node),
                format_age(node.created_at, now), price_text(node), run_text(node, listing, now)]


def request_key(request: QueuedRequest) -> str:
    # a race queues one request per zone under the same name
    return f"{request.provider}/queued/{request.zone}/{request.name}"


def _key(item: Node | QueuedRequest) -> str:
    return node_key(item) if isinstance(item, Node) else request_key(item)


def run_text(node: Node, listing: NodesListing, now: datetime) -> Text:
    """`running 25m` (since it started), `failed 2h ago` (since it ended), `IDLE 3h ~$130` (a READY node
    without a run for a while, and what that idling cost), `-` (never ran); `show` adds what the run ran
    where the screen has room (`running 25m python train.py`). ⏎ opens the run; R lists them."""
    idle = listing.idle_since(node)
    if idle is not None:
        cost = f" ~${idle.cost_while_idle:,.0f}" if idle.cost_while_idle is not None else ""
        return Text(f"IDLE {format_age(idle.idle_since, now)}{cost}", style="bold yellow")
    record = listing.latest_run(node)
    if record is None:
        return Text("-", style="dim")
    style = RUN_STATE_STYLES.get(record.state, "")
    if record.finished_at is None:
        return Text(f"{record.state} {format_age(record.started_at, now)}", style=style)
    return Text(f"{record.state} {format_age(record.finished_at, now)} ago", style=style)
