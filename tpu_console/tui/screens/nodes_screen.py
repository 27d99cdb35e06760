"""The first screen: every configured provider's nodes in one table, refreshed in the background, and the
keys that run the whole workflow on the selected node (create, bootstrap, sync, launch, stop, delete).

Long operations run as background workers and report in the operations panel below the table, so the
table stays usable (and several operations can run at once). Nothing here does I/O itself: what each
operation does is in tui/node_operations.py; here are the keys, the forms and questions before each, and the
panel.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import ClassVar

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static
from textual.worker import Worker

from tpu_console.domain import Node, QueuedRequest
from tpu_console.errors import UserError, close_names, did_you_mean, one_line
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.pricing import price_per_hour
from tpu_console.providers.base import Provider
from tpu_console.secrets import SecretMasker
from tpu_console.tui import node_operations as operations
from tpu_console.tui.messages import NodesRefreshed, OperationEnded, OperationProgress
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.modals.create_node import CreateNodeModal, CreateOrder
from tpu_console.tui.modals.delete_node import DeleteNodeModal
from tpu_console.tui.modals.launch import LaunchModal, LaunchOrder
from tpu_console.tui.modals.sync import SyncModal, SyncOrder
from tpu_console.tui.node_operations import Say, timed
from tpu_console.tui.nodes_feed import (
    NodesListing,
    gather_listing,
    history_version,
    latest_run_now,
    with_history,
)
from tpu_console.tui.options import ConsoleOptions
from tpu_console.tui.widgets.node_table import NodeTable
from tpu_console.tui.widgets.operations_log import OperationsLog
from tpu_console.views.nodes import HOLDS_QUOTA, format_cost

PROBE_EVERY_S = 60.0
HISTORY_CHECK_S = 1.0  # how often the history's file is looked at for runs written by another process


class NodesScreen(Screen[None]):
    HELP_TITLE = "Keys: nodes"
    DEFAULT_CSS = """
    NodesScreen #nodes { height: 1fr; }
    NodesScreen #filter { display: none; height: 1; margin: 0 1; }
    NodesScreen #filter.shown { display: block; }
    NodesScreen #status { height: 1; padding: 0 1; background: $panel; color: $text-muted; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "create", "Create", id="nodes.create",
                tooltip="create: name, type, zones; gcp: capacity, wait-for, race, direct"),
        Binding(
            "d", "delete", "Delete", id="nodes.delete", tooltip="delete the node, once its name is typed back"
        ),
        Binding(
            "b",
            "bootstrap",
            "Bootstrap",
            id="nodes.bootstrap",
            tooltip="the trainer's Python environment on every worker",
        ),
        Binding(
            "s",
            "sync",
            "Sync",
            id="nodes.sync",
            tooltip="this checkout (or a git branch) and an env file onto every worker",
        ),
        Binding(
            "l",
            "launch",
            "Launch",
            id="nodes.launch",
            tooltip="start the trainer on every worker: config, overrides, env file",
        ),
        Binding(
            "x", "stop", "Stop", id="nodes.stop", tooltip="stop the node's run on every worker (asks first)"
        ),
        Binding("r", "refresh", "Refresh", id="nodes.refresh", tooltip="list the nodes again now"),
        Binding(
            "slash",
            "filter",
            "Filter",
            key_display="/",
            id="nodes.filter",
            tooltip="show only rows containing the text typed (any column)",
        ),
        Binding(
            "escape",
            "clear_filter",
            "Clear filter",
            show=False,
            id="nodes.clear_filter",
            tooltip="clear the filter; with none, offer to cancel a queued create",
        ),
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
        self.running: list[str] = []  # the operations under way, in the order they started
        # node -> the last run launched from here: `enter` opens it even before the listing has it
        self.launched: dict[str, str] = {}
        self.queued_creates: dict[str, Worker] = {}  # creates that may be waiting in a queue, by label
        self._problems: list[str] = []
        self._probed_at = float("-inf")
        self._probe_wanted = True
        self._listings_under_way = 0
        self._history_version: int | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(
            placeholder="filter: part of a name, type, zone or state (esc clears)", id="filter", compact=True
        )
        yield NodeTable(id="nodes")
        yield Static("loading nodes...", id="status")
        yield OperationsLog(clock=self.clock, id="ops")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.action_refresh()
        self.set_interval(self.refresh_every, self._tick)
        # A run launched elsewhere (the CLI, another console) shows within a second, not at the next listing.
        self.set_interval(HISTORY_CHECK_S, self._check_history)
        self.query_one(NodeTable).focus()
        self.query_one(OperationsLog).say("operations", "long work (c d b s l x) reports here as it goes")

    # -- the table -------------------------------------------------------------------------------------

    def action_refresh(self) -> None:
        self.query_one("#status", Static).update("refreshing...")
        self._probe_wanted = True
        self.refresh_nodes()

    def _tick(self) -> None:
        # A timed refresh waits for one under way (a gcp listing over many zones can take longer than the
        # interval; cancelling it each tick would never show anything). `r` does cancel and start again.
        if not self._listings_under_way:
            self.refresh_nodes()

    def _check_history(self) -> None:
        version = history_version(self.store)
        if version != self._history_version and self.refreshes:
            self._history_version = version
            self.reread_history()

    @work(exclusive=True, group="history", exit_on_error=False)
    async def reread_history(self) -> None:
        listing = await asyncio.to_thread(
            with_history, self.listing, self.store, self.clock(), self.options.idle_after
        )
        self.post_message(NodesRefreshed(listing, history_only=True))

    @work(exclusive=True, group="refresh", exit_on_error=False)
    async def refresh_nodes(self) -> None:
        # exclusive: a slow provider (gcp across many zones) never piles up listings.
        # Probing runs reaches every worker of the nodes with one: when asked for (r, an operation's end)
        # or when the last probe is a minute old, not on every 15 s tick. A listing cancelled by the next
        # one leaves the wish in place, so a probe asked for is never lost.
        probe = self._probe_wanted or time.monotonic() - self._probed_at >= PROBE_EVERY_S
        self._probe_wanted = False
        self._listings_under_way += 1
        try:
            listing = await gather_listing(
                self.providers, self.store, self.clock(), self.options.idle_after, probe
            )
        except asyncio.CancelledError:
            self._probe_wanted = self._probe_wanted or probe
            raise
        finally:
            self._listings_under_way -= 1
        if probe:
            self._probed_at = time.monotonic()
        self.post_message(NodesRefreshed(listing))

    def on_nodes_refreshed(self, message: NodesRefreshed) -> None:
        if message.history_only:  # the history changed: the latest runs again, on the nodes as listed
            self.listing = replace(self.listing, latest_runs=message.listing.latest_runs,
                                   idle=message.listing.idle)
            self._show()
            return
        self.refreshes += 1
        self.listing = message.listing
        self._show()
        for problem in self.listing.problems:
            if problem not in self._problems:
                self.notify(problem, title="provider problem", severity="warning")
        self._problems = self.listing.problems

    def _show(self) -> None:
        now = self.clock()
        table = self.query_one(NodeTable)
        table.show(self.listing, now, self.filter_text)
        self.query_one("#status", Static).update(self._status_text(table.row_count, now))

    def _status_text(self, shown: int, now: datetime) -> str:
        count = len(self.listing.nodes)
        if count:
            summary = f"{count} node{'s' if count != 1 else ''}"
            if self.filter_text:  # queued requests' rows are no filter's doing
                summary += f" ({shown} match /{escape(self.filter_text)}"
                if not shown:  # a mistyped name
                    names = [node.name for node in self.listing.nodes]
                    summary += escape(did_you_mean(close_names(self.filter_text, names)))
                summary += ")"
        else:
            summary = "no nodes: press c to create one"
        text = f"{summary} · updated {now:%H:%M:%S}"
        prices = [p.per_hour for node in self.listing.nodes if (p := price_per_hour(node)) is not None]
        if prices:
            text += f" · ~${sum(prices):,.2f}/h"
        if self.listing.idle:
            text += f" · [b yellow]{len(self.listing.idle)} idle[/b yellow]"
        waiting = [r for r in self.listing.requests if not r.has_node]
        if waiting:
            text += f" · {len(waiting)} queued"
            if held := [r for r in waiting if r.state.holds_quota]:
                text += f" [b red]({len(held)} {HOLDS_QUOTA})[/b red]"

        if self.running:
            text += f" · [b]running:[/b] {', '.join(self.running)}"
        if self.listing.problems:
            more = len(self.listing.problems) - 1
            text += f" · [b]problem:[/b] {self.listing.problems[0]}" + (f" (+{more} more)" if more else "")
        return text

    def selected_node(self) -> Node | None:
        return self.query_one(NodeTable).selected_node()

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
            self.query_one(NodeTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if not box.has_class("shown") and not self.filter_text and self.queued_creates:
            self._offer_cancel()
            return
        box.value = ""
        box.remove_class("shown")
        self.filter_text = ""
        self._show()
        self.query_one(NodeTable).focus()

    # -- operations ----------------------------------------------------------------------------------

    def run_operation(
        self, label: str, body: Callable[[Say], Awaitable[str]], masker: SecretMasker | None = None
    ) -> Worker:
        """Run `body` in the background (several may run at once); every line it says, and its outcome,
        land in the operations panel, with the node's `.env` values masked."""
        self.running.append(label)
        self._show()
        return self.run_worker(
            self._operation(label, body, masker or SecretMasker()), group="operations", exit_on_error=False
        )

    async def _operation(
        self, label: str, body: Callable[[Say], Awaitable[str]], masker: SecretMasker
    ) -> None:
        def say(text: str, style: str = "") -> None:
            self.post_message(OperationProgress(label, masker.mask(text), style))

        say("started")
        try:
            outcome = await body(say)
        except asyncio.CancelledError:  # cancelled before anything was left to clean up
            self.post_message(OperationEnded(label, "", problem="cancelled"))
            raise
        except UserError as exc:
            self.post_message(OperationEnded(label, "", problem=masker.mask(f"refused: {exc}")))
        except Exception as exc:  # noqa: BLE001 - an operation's failure is reported, never the app's end
            self.post_message(OperationEnded(label, "", problem=masker.mask(f"failed: {one_line(exc)}")))
        else:
            self.post_message(OperationEnded(label, masker.mask(outcome)))

    def on_operation_progress(self, message: OperationProgress) -> None:
        self.query_one(OperationsLog).say(message.operation, message.text, message.style)

    def on_operation_ended(self, message: OperationEnded) -> None:
        log = self.query_one(OperationsLog)
        if message.problem:
            log.say(message.operation, message.problem, "red")
            self.notify(message.problem, title=message.operation, severity="error")
        else:
            log.say(message.operation, message.outcome, "green")
            self.notify(message.outcome, title=message.operation)
        if message.operation in self.running:
            self.running.remove(message.operation)
        self.queued_creates.pop(message.operation, None)
        self.action_refresh()  # what the operation changed shows at once

    def action_create(self) -> None:
        taken = {node.name: node.provider for node in self.listing.nodes}
        modal = CreateNodeModal(
            list(self.providers), self.options.default_provider, self.options.zones, taken,
            project=self.options.gcp_project,
        )
        self.app.push_screen(modal, self._create)

    def _create(self, order: CreateOrder | None) -> None:
        if order is None:
            return
        label = f"create {order.request.name}"
        body = timed(order.request.name, "create", partial(operations.create, self.providers, order))
        worker = self.run_operation(label, body)
        if order.request.queued and operations.queues(order.request.accelerator_type):
            self.queued_creates[label] = worker

    def _offer_cancel(self) -> None:
        """esc with a queued create under way: cancel it (the request deleted, and confirmed gone)?"""
        label = list(self.queued_creates)[-1]
        question = (f"Cancel {label}? Its queued request is deleted and its deletion confirmed; "
                    "No keeps it waiting.")

        def answer(yes: bool | None) -> None:
            worker = self.queued_creates.get(label)
            if yes and worker is not None:
                self.query_one(OperationsLog).say(label, "cancel asked: deleting the queued request")
                worker.cancel()

        self.app.push_screen(ConfirmModal(question, "Cancel the request"), answer)

    def action_delete(self) -> None:
        item = self.query_one(NodeTable).selected()
        if isinstance(item, QueuedRequest):
            self._delete_request(item)
            return
        node = self._require_node("delete")
        if node is not None:
            modal = DeleteNodeModal(node, format_cost(node, self.clock()))
            self.app.push_screen(modal, lambda yes: self._delete(node) if yes else None)

    def _delete_request(self, request: QueuedRequest) -> None:
        quota = f" It {HOLDS_QUOTA}." if request.state.holds_quota else ""
        question = f"Delete the queued request {request.name} ({request.state}) in {request.zone}?{quota}"

        delete = partial(operations.delete_queued_request, self.providers, request)

        def answer(yes: bool | None) -> None:
            if yes:
                self.run_operation(f"delete {request.name}", delete)

        self.app.push_screen(ConfirmModal(question, "Delete"), answer)

    def _delete(self, node: Node) -> None:
        delete = partial(operations.delete, self.providers, node)
        self.run_operation(f"delete {node.name}", delete, SecretMasker.for_node(node.name))

    def action_bootstrap(self) -> None:
        node = self._require_node("bootstrap")
        if node is None:
            return
        bootstrap = partial(operations.bootstrap, self.providers, node)
        self.run_operation(f"bootstrap {node.name}", timed(node.name, "bootstrap", bootstrap),
                           SecretMasker.for_node(node.name))

    def action_sync(self) -> None:
        node = self._require_node("sync")
        if node is not None:
            modal = SyncModal(node, self.options.sync_env_file)
            self.app.push_screen(modal, lambda order: self._sync(node, order))

    def _sync(self, node: Node, order: SyncOrder | None) -> None:
        if order is None:
            return
        sync = partial(operations.sync, self.providers, node, order)
        masker = SecretMasker.for_node(node.name, [order.env_file] if order.env_file else [])
        self.run_operation(f"sync {node.name}", timed(node.name, "sync", sync), masker)

    def action_launch(self) -> None:
        node = self._require_node("launch on")
        if node is not None:
            self.app.push_screen(
                LaunchModal(node, self.providers.get(node.provider)), lambda order: self._launch(node, order)
            )

    def _launch(self, node: Node, order: LaunchOrder | None) -> None:
        if order is None:
            return
        webhook_url = self.options.webhook_url.get_secret_value() if self.options.webhook_url else None

        async def launch(say: Say) -> str:
            result = await operations.launch(self.providers, node, order, say, store=self.store,
                                             webhook_url=webhook_url)
            self.launched[node.name] = result.run_id
            return f"run {result.run_id} started on {len(result.workers)} worker(s): enter opens it"

        masker = SecretMasker.for_node(node.name, [order.env_file] if order.env_file else [])
        self.run_operation(f"launch {node.name}", launch, masker)

    def action_stop(self) -> None:
        node = self._require_node("stop the run of")
        if node is None:
            return
        record = latest_run_now(node, self.store) or self.listing.latest_run(node)
        launched = self.launched.get(node.name)
        if launched and (record is None or launched > record.run_id):
            record = (self.store or RunStore()).get(launched)  # launched here since the last listing
        if record is None or record.finished:
            self.notify(f"{node.name} has no run in progress", severity="warning")
            return
        question = f"Stop run {record.run_id} on {node.name} (TERM, then KILL after 10 s, on every worker)?"
        self.app.push_screen(ConfirmModal(question, "Stop"), lambda yes: self._stop(record) if yes else None)

    def _stop(self, record: RunRecord) -> None:
        stop = partial(operations.stop, self.providers, record, store=self.store)
        self.run_operation(f"stop {record.run_id}", stop, SecretMasker.for_node(record.node))

    def action_open_run(self) -> None:
        node = self._require_node("open the run of")
        if node is None:
            return
        # The history now, not the last listing: a run launched since, from here or the CLI, is the latest.
        record = latest_run_now(node, self.store) or self.listing.latest_run(node)
        # Run ids sort by their start: a run launched here that the history lacks yet is the latest.
        known = [record.run_id] if record is not None else []
        run_id = max([*known, self.launched.get(node.name, "")]) or None
        if run_id is None:
            self.notify(f"{node.name} has no runs yet: press l to launch one", severity="warning")
            return
        from tpu_console.tui.screens.run_screen import RunScreen

        self.app.push_screen(RunScreen(self.providers, run_id, self.store, clock=self.clock))

    def on_data_table_row_selected(self, _event: DataTable.RowSelected) -> None:
        self.action_open_run()

