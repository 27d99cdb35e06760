"""The first screen: every configured provider's nodes in one table, refreshed in the background, and the
keys that run the whole workflow on the selected node (create, bootstrap, sync, launch, stop, delete).

Long operations run as background workers and report in the operations panel below the table, so the
table stays usable (and several operations can run at once). Nothing here does I/O itself: it calls
`tpu_console.actions`, `provision`, `runs` and the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from tpu_console import actions
from tpu_console.errors import UserError, one_line
from tpu_console.idle import IdleNode, find_idle
from tpu_console.model import Node
from tpu_console.node_table import COLUMNS, format_age, format_cost, node_row
from tpu_console.providers.base import Provider
from tpu_console.runs.store import RunRecord, RunStore
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.modals.create_node import CreateNodeModal, CreateOrder
from tpu_console.tui.modals.delete_node import DeleteNodeModal
from tpu_console.tui.modals.launch import LaunchModal, LaunchOrder
from tpu_console.tui.styles import NODE_STATE_STYLES, RUN_STATE_STYLES
from tpu_console.tui.widgets.operations_log import OperationsLog

TABLE_COLUMNS = (*COLUMNS, "RUN")


@dataclass(frozen=True)
class ConsoleOptions:
    """What the app takes from the settings: where `c` creates, which zones it offers, when a node is idle,
    and the `.env` that `s` uploads."""

    default_provider: str = "local"
    zones: list[str] = field(default_factory=list)
    idle_after: timedelta = timedelta(minutes=60)
    sync_env_file: str | None = None


@dataclass
class NodesListing:
    nodes: list[Node] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    latest_runs: dict[str, RunRecord] = field(default_factory=dict)  # node name -> its latest run
    idle: dict[str, IdleNode] = field(default_factory=dict)


class NodesRefreshed(Message):
    def __init__(self, listing: NodesListing) -> None:
        super().__init__()
        self.listing = listing


class NodesScreen(Screen[None]):
    DEFAULT_CSS = """
    NodesScreen #nodes { height: 1fr; }
    NodesScreen #filter { display: none; height: 3; }
    NodesScreen #filter.shown { display: block; }
    NodesScreen #status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "create", "Create", id="nodes.create"),
        Binding("d", "delete", "Delete", id="nodes.delete"),
        Binding("b", "bootstrap", "Bootstrap", id="nodes.bootstrap"),
        Binding("s", "sync", "Sync", id="nodes.sync"),
        Binding("l", "launch", "Launch", id="nodes.launch"),
        Binding("x", "stop", "Stop", id="nodes.stop"),
        Binding("enter", "open_run", "Open run", id="nodes.open_run"),
        Binding("r", "refresh", "Refresh", id="nodes.refresh"),
        Binding("slash", "filter", "Filter", key_display="/", id="nodes.filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="nodes.clear_filter"),
    ]

    def __init__(
        self,
        providers: dict[str, Provider],
        *,
        refresh_every: float,
        clock: Callable[[], datetime],
        store: RunStore | None = None,
        options: ConsoleOptions | None = None,
    ) -> None:
        super().__init__()
        self.providers = providers
        self.refresh_every = refresh_every
        self.clock = clock
        self.store = store
        self.options = options or ConsoleOptions()
        self.refreshes = 0  # completed refreshes; tests and the status line read it
        self.listing = NodesListing()
        self.filter_text = ""
        self.operations_running = 0
        self._problems: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter: part of a name, type, zone or state (esc clears)", id="filter")
        yield DataTable(id="nodes", cursor_type="row", zebra_stripes=True)
        yield Static("loading nodes...", id="status")
        yield OperationsLog(clock=self.clock, id="ops")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#nodes", DataTable)
        for column in TABLE_COLUMNS:
            table.add_column(column, key=column)
        self.action_refresh()
        self.set_interval(self.refresh_every, self.action_refresh)
        table.focus()
        self.query_one("#ops", OperationsLog).say("operations", "long work (c b s l x d) reports here as it goes")

    # -- the table -------------------------------------------------------------------------------------

    def action_refresh(self) -> None:
        self.query_one("#status", Static).update("refreshing...")
        self.refresh_nodes()

    @work(exclusive=True, group="refresh", exit_on_error=False)
    async def refresh_nodes(self) -> None:
        # exclusive: a slow provider (gcp across many zones) never piles up listings.
        try:
            listing = await actions.list_nodes(self.providers)
        except Exception as exc:  # noqa: BLE001 - shown on screen; the next refresh may succeed
            listing = actions.NodeList(problems=[f"listing failed: {one_line(exc)}"])
        runs = await asyncio.to_thread(self._runs)
        latest: dict[str, RunRecord] = {}
        for record in runs:  # most recent first
            latest.setdefault(record.node, record)
        idle = {i.node.name: i for i in find_idle(listing.nodes, runs, self.clock(), self.options.idle_after)}
        self.post_message(NodesRefreshed(NodesListing(listing.nodes, listing.problems, latest, idle)))

    def _runs(self) -> list[RunRecord]:
        try:
            return (self.store or RunStore()).list(limit=500)
        except Exception:  # noqa: BLE001 - the history is a nicety on this screen, never a reason to fail
            return []

    def on_nodes_refreshed(self, message: NodesRefreshed) -> None:
        self.refreshes += 1
        self.listing = message.listing
        self._show()
        new_problems = [p for p in self.listing.problems if p not in self._problems]
        for problem in new_problems:
            self.notify(problem, title="provider problem", severity="warning")
        self._problems = self.listing.problems

    def _show(self) -> None:
        table = self.query_one("#nodes", DataTable)
        now = self.clock()
        selected = self._selected_key()
        table.clear()
        shown = 0
        for node in self.listing.nodes:
            cells = [*node_row(node, now), self._run_cell(node, now)]
            if self.filter_text and not any(self.filter_text in str(c).lower() for c in cells):
                continue
            state = Text(cells[4], style=NODE_STATE_STYLES.get(node.state, ""))
            table.add_row(*cells[:4], state, *cells[5:-1], cells[-1], key=f"{node.provider}/{node.name}")
            shown += 1
        if selected is not None and selected in table.rows:
            table.move_cursor(row=table.get_row_index(selected))
        self.query_one("#status", Static).update(self._status_text(shown, now))

    def _run_cell(self, node: Node, now: datetime) -> Text:
        if node.name in self.listing.idle:
            idle = self.listing.idle[node.name]
            cost = f" ~${idle.cost_while_idle:,.2f}" if idle.cost_while_idle is not None else ""
            return Text(f"IDLE {format_age(idle.idle_since, now)}{cost}", style="bold yellow")
        record = self.listing.latest_runs.get(node.name)
        if record is None:
            return Text("-", style="dim")
        # The id without its date (the table is narrow; AGE and `R` give the rest): HHMMSS-xxxx state.
        return Text(f"{record.run_id[9:]} {record.state}", style=RUN_STATE_STYLES.get(record.state, ""))

    def _status_text(self, shown: int, now: datetime) -> str:
        count = len(self.listing.nodes)
        if count:
            summary = f"{count} node{'s' if count != 1 else ''}"
            if shown != count:
                summary += f" ({shown} match /{self.filter_text})"
        else:
            summary = "no nodes: press c to create one"
        text = f"{summary} · updated {now:%H:%M:%S}"
        if self.listing.idle:
            text += f" · [b yellow]{len(self.listing.idle)} idle[/b yellow]"
        if self.operations_running:
            text += f" · {self.operations_running} operation(s) running"
        if self.listing.problems:
            more = len(self.listing.problems) - 1
            text += f" · [b]problem:[/b] {self.listing.problems[0]}" + (f" (+{more} more)" if more else "")
        return text

    def _selected_key(self) -> str | None:
        table = self.query_one("#nodes", DataTable)
        if table.row_count == 0:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - no valid cursor yet
            return None

    def selected_node(self) -> Node | None:
        key = self._selected_key()
        return next((n for n in self.listing.nodes if f"{n.provider}/{n.name}" == key), None)

    def _require_node(self, doing: str) -> Node | None:
        node = self.selected_node()
        if node is None:
            self.notify(f"select a node to {doing} (up/down), or press c to create one", severity="warning")
        return node

    # -- filter ----------------------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "filter":
            self.filter_text = event.value.strip().lower()
            self._show()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "filter":
            self.query_one("#nodes", DataTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("shown")
        self.filter_text = ""
        self._show()
        self.query_one("#nodes", DataTable).focus()

    # -- operations ------------------------------------------------------------------------------------

    def run_operation(self, label: str, work: Callable[[OperationsLog], Awaitable[str]]) -> None:
        """Run `work` in the background; its progress and its outcome land in the operations panel."""
        self.run_worker(self._operation(label, work), group="operations", exit_on_error=False)

    async def _operation(self, label: str, work: Callable[[OperationsLog], Awaitable[str]]) -> None:
        log = self.query_one("#ops", OperationsLog)
        self.operations_running += 1
        log.say(label, "started")
        try:
            outcome = await work(log)
        except UserError as exc:
            log.say(label, f"refused: {exc}", "red")
            self.notify(str(exc), title=label, severity="error")
        except Exception as exc:  # noqa: BLE001 - an operation's failure is reported, never the app's end
            log.say(label, f"failed: {one_line(exc)}", "red")
            self.notify(one_line(exc), title=f"{label} failed", severity="error")
        else:
            log.say(label, outcome, "green")
            self.notify(outcome, title=label)
        finally:
            self.operations_running -= 1
            self.action_refresh()

    def action_create(self) -> None:
        modal = CreateNodeModal(list(self.providers), self.options.default_provider, self.options.zones)
        self.app.push_screen(modal, self._create)

    def _create(self, order: CreateOrder | None) -> None:
        if order is None:
            return

        async def create(log: OperationsLog) -> str:
            label = f"create {order.request.name}"
            node = await actions.create_node(self.providers, order.provider, order.request,
                                             progress=lambda line: log.say(label, line))
            where = f" in {node.zone}" if node.zone else ""
            return f"{node.name} is {node.state.value}{where}"

        self.run_operation(f"create {order.request.name}", create)

    def action_delete(self) -> None:
        node = self._require_node("delete")
        if node is not None:
            modal = DeleteNodeModal(node, format_cost(node, self.clock()))
            self.app.push_screen(modal, lambda yes: self._delete(node) if yes else None)

    def _delete(self, node: Node) -> None:
        async def delete(log: OperationsLog) -> str:
            await actions.delete_node(self.providers, node.name, progress=lambda line: log.say(f"delete {node.name}", line))
            return f"{node.name} deleted"

        self.run_operation(f"delete {node.name}", delete)

    def action_bootstrap(self) -> None:
        node = self._require_node("bootstrap")
        if node is None:
            return

        async def bootstrap(log: OperationsLog) -> str:
            from tpu_console.provision.bootstrap import bootstrap_node

            label = f"bootstrap {node.name}"
            result = await bootstrap_node(self.providers, node.name, progress=lambda line: log.say(label, line),
                                          on_worker=lambda w, text: log.say(label, f"[{w}] {text}"))
            return _setup_outcome(result, "bootstrapped")

        self.run_operation(f"bootstrap {node.name}", bootstrap)

    def action_sync(self) -> None:
        node = self._require_node("sync")
        if node is None:
            return

        async def sync(log: OperationsLog) -> str:
            from tpu_console.provision.code_sync import sync_node

            label = f"sync {node.name}"
            result = await sync_node(self.providers, node.name, env_file=self.options.sync_env_file,
                                     progress=lambda line: log.say(label, line),
                                     on_worker=lambda w, text: log.say(label, f"[{w}] {text}"))
            return _setup_outcome(result, "synced")

        self.run_operation(f"sync {node.name}", sync)

    def action_launch(self) -> None:
        node = self._require_node("launch on")
        if node is not None:
            self.app.push_screen(LaunchModal(node), lambda order: self._launch(node, order))

    def _launch(self, node: Node, order: LaunchOrder | None) -> None:
        if order is None:
            return

        async def launch(log: OperationsLog) -> str:
            from tpu_console.runs.launch import launch as launch_run

            label = f"launch {node.name}"
            result = await launch_run(self.providers, node.name, order.config_path, order.overrides,
                                      order.env_file, kill_stale=order.kill_stale, store=self.store,
                                      progress=lambda line: log.say(label, line),
                                      on_worker=lambda w, text: log.say(label, f"[{w}] {text}"))
            for start in result.starts:
                log.say(label, f"[{start.worker}] " + (f"started, pgid {start.pgid}" if start.ok else
                                                       f"failed: {start.error}"))
            if not result.ok:
                raise RuntimeError("the job did not start on every worker; nothing is left running")
            return f"run {result.run_id} started on {len(result.workers)} worker(s): enter opens it"

        self.run_operation(f"launch {node.name}", launch)

    def action_stop(self) -> None:
        node = self._require_node("stop the run of")
        if node is None:
            return
        record = self.listing.latest_runs.get(node.name)
        if record is None or record.finished:
            self.notify(f"{node.name} has no run in progress", severity="warning")
            return
        question = f"Stop run {record.run_id} on {node.name} (TERM, then KILL after 10 s, on every worker)?"
        self.app.push_screen(ConfirmModal(question, "Stop"), lambda yes: self._stop(record) if yes else None)

    def _stop(self, record: RunRecord) -> None:
        async def stop(log: OperationsLog) -> str:
            from tpu_console.runs import control

            view, stops = await control.stop(self.providers, record.run_id, store=self.store)
            for s in stops:
                log.say(f"stop {record.run_id}", f"[{s.worker}] {s.outcome} {s.signal or ''} exit {s.exit_status}")
            return f"{record.run_id}: {view.state}"

        self.run_operation(f"stop {record.run_id}", stop)

    def action_open_run(self) -> None:
        node = self._require_node("open the run of")
        if node is None:
            return
        record = self.listing.latest_runs.get(node.name)
        if record is None:
            self.notify(f"{node.name} has no runs yet: press l to launch one", severity="warning")
            return
        from tpu_console.tui.screens.run_screen import RunScreen

        self.app.push_screen(RunScreen(self.providers, record.run_id, self.store, clock=self.clock))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_run()


def _setup_outcome(result, done: str) -> str:
    failed = [w for w in result.workers if not w.ok]
    if failed:
        raise RuntimeError(f"worker {failed[0].worker}: {failed[0].error} ({len(failed)} of {len(result.workers)} failed)")
    first = result.workers[0] if result.workers else None
    return f"{done} {len(result.workers)} worker(s)" + (f": {first.report.versions_label()}" if first else "")
