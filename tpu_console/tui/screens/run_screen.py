"""The live dashboard of one run: worker grid on top, then logs, step-time breakdown, HBM and plots in tabs.

Holds the keys and routes the feed's messages to the widgets; the data comes from `RunFeed` only (a
`RunWatch` on the run, followed by an exclusive background worker; libtpu's device metrics by another
while the HBM tab is shown), so tests can hand the screen a feed of fixed messages. `x` stops the run
(after a yes), what to do when workers hang after another one failed; `t` shows where each worker is stuck
(its Python stacks), offered when the run stalls.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import cached_property
from typing import ClassVar, Protocol

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, TabbedContent, TabPane

from tpu_console.errors import NotFound, one_line
from tpu_console.history import ownership
from tpu_console.history.store import RunStore
from tpu_console.providers.base import Provider
from tpu_console.tui.messages import (
    RunDevicesRead,
    RunFeedProblem,
    RunLogLines,
    RunSignatureFound,
    RunStepsArrived,
    RunSupervisorDecided,
    RunUpdated,
)
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.modals.full_text import FullTextModal
from tpu_console.tui.modals.stacks import StacksModal
from tpu_console.tui.modals.stop_theirs import StopTheirsModal
from tpu_console.tui.notices import Notices
from tpu_console.tui.run_feed import Post, RunFeed, local_now
from tpu_console.tui.run_snapshot import DeviceReadings, RunSnapshot, StepHistory
from tpu_console.tui.widgets.hbm_panel import HbmPanel
from tpu_console.tui.widgets.log_pane import LogPane, LogStatus
from tpu_console.tui.widgets.metric_plots import MetricPlots
from tpu_console.tui.widgets.run_header import RunHeader, first_failure_text, worker_text
from tpu_console.tui.widgets.run_log_search import LogSearch
from tpu_console.tui.widgets.step_breakdown import StepBreakdown
from tpu_console.tui.widgets.worker_grid import WorkerGrid

TABS = {"logs": "tab-logs", "steps": "tab-steps", "hbm": "tab-hbm", "plots": "tab-plots"}


class Feed(Protocol):
    """What the screen needs from its data source (RunFeed, or fixed messages in tests)."""

    async def follow(self, post: Post) -> None: ...

    async def follow_devices(self, post: Post) -> None: ...

    async def stop_run(self) -> str: ...

    async def stacks(self) -> str: ...

    async def close(self) -> None: ...


def _worker_bindings() -> list[BindingType]:
    # One binding per digit (so each can be remapped), shown once as "0-9" in the footer and help.
    return [
        Binding(str(n), f"follow_worker({n})", "Worker", show=n == 0, key_display="0-9", id=f"run.worker_{n}")
        for n in range(10)
    ]


class RunScreen(Screen[None]):
    DEFAULT_CSS = """
    RunScreen #run-tabs {
        height: 1fr;
    }
    RunScreen #run-tabs ContentSwitcher, RunScreen #run-tabs TabPane {
        height: 1fr;
        padding: 0;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", id="run.back"),
        *_worker_bindings(),
        # tab and a are left out of the footer (help has them) so that every other key fits 100 columns
        Binding("tab", "cycle_worker(1)", "Next", show=False, priority=True, id="run.next_worker",
                tooltip="follow the next worker"),
        Binding("shift+tab", "cycle_worker(-1)", "Previous", show=False, priority=True,
                id="run.previous_worker"),
        Binding("a", "follow_all", "All", show=False, id="run.all_workers",
                tooltip="every worker's log, interleaved"),
        Binding("f", "toggle_follow", "Follow", id="run.follow"),
        Binding("w", "toggle_wrap", "Wrap", id="run.wrap",
                tooltip="wrap long log lines, or cut them (less -S)"),
        Binding("e", "first_failure", "Error", id="run.first_failure",
                tooltip="the run's first failure, whole"),
        Binding("enter", "worker_error", "Worker error", show=False, id="run.worker_error",
                tooltip="the followed worker's last error, whole"),
        # Priority: it runs as the app reads the key, so the keys typed after it reach the prompt.
        Binding("slash", "search", "Search", key_display="/", priority=True, id="run.search"),
        Binding("n", "next_match(1)", "Next match", show=False, id="run.next_match"),
        Binding("N", "next_match(-1)", "Prev match", show=False, id="run.previous_match"),
        Binding("l", "show_tab('logs')", "Logs", id="run.tab_logs"),
        Binding("s", "show_tab('steps')", "Steps", id="run.tab_steps"),
        Binding("m", "show_tab('hbm')", "HBM", id="run.tab_hbm"),
        Binding("p", "show_tab('plots')", "Plots", id="run.tab_plots"),
        Binding("x", "stop_run", "Stop", id="run.stop"),
        Binding("t", "stacks", "Stacks", id="run.stacks", tooltip="where each worker is stuck"),
    ]

    def __init__(
        self,
        providers: dict[str, Provider],
        run_id: str,
        store: RunStore | None = None,
        clock: Callable[[], datetime] = local_now,
        *,
        feed: Feed | None = None,
    ) -> None:
        super().__init__()
        self.run_id = run_id
        self._store = store
        self._launched_by: dict | None = None  # read on first use (_theirs)
        self.feed: Feed = feed or RunFeed(providers, run_id, store, clock=clock)
        self.snapshot: RunSnapshot | None = None
        self.history = StepHistory()
        self.problem: str | None = None
        self.devices: DeviceReadings | None = None  # libtpu's last reading; None until one is made
        self.worker: int | None = None  # the followed worker; None = every worker interleaved
        self.verdict_shown = False
        self.hung_shown = False
        self.stuck_shown = False
        self.signatures_shown: set[str] = set()  # kinds of log signature already announced
        self._steps_pending = False
        self._stragglers_drawn: dict[int, str] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield RunHeader(id="run-header")
        yield WorkerGrid(id="workers")
        with TabbedContent(id="run-tabs", initial=TABS["logs"]):
            with TabPane("Logs", id=TABS["logs"]):
                yield LogStatus(id="log-status")
                yield LogPane(id="log")
                yield LogSearch(id="log-search")
            with TabPane("Steps", id=TABS["steps"]), VerticalScroll():
                yield StepBreakdown(id="breakdown")
            with TabPane("HBM", id=TABS["hbm"]), VerticalScroll():
                yield HbmPanel(id="hbm")
            with TabPane("Plots", id=TABS["plots"]):
                yield MetricPlots(id="plots")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.sub_title = f"run {self.run_id}"
        self._show_header()
        self._show_steps()
        self._show_hbm()
        self._show_log_status()
        self.query_one(LogPane).focus()
        self._watch_run()

    # -- background feed -------------------------------------------------------------------------------

    @work(exclusive=True, group="run-feed", exit_on_error=False)
    async def _watch_run(self) -> None:
        await self.feed.follow(self.post_message)

    @work(exclusive=True, group="run-devices", exit_on_error=False)
    async def _follow_devices(self) -> None:
        await self.feed.follow_devices(self.post_message)

    @cached_property
    def notices(self) -> Notices:
        """The dashboard's notices: one per subject (the run's state, a log signature, the supervisor, a
        stop, a key's answer), at most three at once, taken down when what they say no longer holds."""
        return Notices(self.app)

    async def on_unmount(self) -> None:
        if "notices" in self.__dict__:  # about this run: they do not follow the person back to the nodes
            self.notices.withdraw_all()
        await self.feed.close()  # the workers' jobs keep running; only the watching stops

    def on_run_updated(self, message: RunUpdated) -> None:
        self.snapshot = message.snapshot
        self.query_one(WorkerGrid).show(self.snapshot, self.worker)
        self._show_hbm()
        self._show_header()
        steps_shown = self.query_one(TabbedContent).active == TABS["steps"]
        if self._stragglers() != self._stragglers_drawn and steps_shown:
            self._show_steps()
        self._notice_run_state()

    def _notice_run_state(self) -> None:
        """One notice about the run's state at a time: a hang or a stall while it lasts, then the end
        (which takes the place of both; the header keeps saying what still holds)."""
        snapshot = self.snapshot
        if snapshot is None:
            return
        if snapshot.ended:
            if not self.verdict_shown:
                self.verdict_shown = True
                detail = f": {snapshot.failure}" if snapshot.failure else ""
                severity = "information" if snapshot.state == "succeeded" else "error"
                self.notices.show("run", f"{self.run_id} {snapshot.state}{detail}", title="run ended",
                                  severity=severity)
                self._desktop(snapshot.state, f"run {self.run_id} {snapshot.state}{detail}")
            return
        if snapshot.hung:
            if not self.hung_shown:
                self.hung_shown = True
                self.notices.show(
                    "run",
                    f"worker(s) {', '.join(map(str, snapshot.hung))} still running after worker "
                    f"{snapshot.first_failure} failed, likely hung in a collective and holding the TPU: "
                    "x stops the run, t shows where each one waits",
                    title="run hung", severity="error", timeout=60)
        elif snapshot.all_silent:  # every running worker stalled: the run as a whole
            if not self.stuck_shown:
                self.stuck_shown = True
                self.notices.show("run", "the run looks stuck: t shows every worker's Python stacks (where "
                                  "each one waits)", title="run stalled", severity="warning", timeout=60)
        elif self.hung_shown or self.stuck_shown:  # it moved on: what the notice said no longer holds
            self.hung_shown = self.stuck_shown = False
            self.notices.withdraw("run")

    def _desktop(self, event: str, text: str) -> None:
        """The desktop notification of `[notify] desktop` (the pod's supervisor tells the webhook)."""
        options = getattr(self.app, "options", None)
        if options is not None and options.desktop_notify:
            from tpu_console.observe.notifications import Notifier

            Notifier(desktop=True).notify(event, text)

    def on_run_signature_found(self, message: RunSignatureFound) -> None:
        # Once per kind: on a pod the same problem (TPU in use ...) shows on every worker at once.
        if message.kind not in self.signatures_shown:
            self.signatures_shown.add(message.kind)
            self.notices.show(f"log:{message.kind}", message.message, title=f"worker {message.worker}'s log",
                              severity="error")

    def on_run_supervisor_decided(self, message: RunSupervisorDecided) -> None:
        if message.decisions:  # the latest, in place of the one before (the header and status keep them all)
            self.notices.show("supervisor", "\n".join(message.decisions[-3:]), title="supervisor on the pod")

    def on_run_devices_read(self, message: RunDevicesRead) -> None:
        by_worker = {m.worker: m for m in message.workers}
        if not by_worker and self.devices is not None:
            by_worker = self.devices.by_worker  # nothing new could be read: the last reading stays, with why
        self.devices = DeviceReadings(by_worker, message.problem)
        self._show_hbm()

    def on_run_steps_arrived(self, message: RunStepsArrived) -> None:
        # Redraw once, after the last of the messages waiting.
        new = [self.history.add(worker, steps) for worker, steps in message.by_worker.items()]
        if any(new) and not self._steps_pending:
            self._steps_pending = True
            self.call_later(self._show_steps)

    def on_run_log_lines(self, message: RunLogLines) -> None:
        self.query_one(LogPane).add_lines(message.lines)
        self._show_log_status()

    def on_run_feed_problem(self, message: RunFeedProblem) -> None:
        if message.problem != self.problem:
            self.problem = message.problem
            self._show_header()

    # -- keys ------------------------------------------------------------------------------------------

    def action_back(self) -> None:
        self.dismiss()

    def action_follow_worker(self, worker: int) -> None:
        if worker not in self.run_workers():
            self.notices.show("key", f"no worker {worker} in this run (workers {self._worker_range()})",
                              severity="warning")
            return
        self._follow(worker)

    def action_cycle_worker(self, step: int) -> None:
        workers = self.run_workers()
        if not workers:
            return
        if self.worker not in workers:
            self._follow(workers[0] if step > 0 else workers[-1])
        else:
            self._follow(workers[(workers.index(self.worker) + step) % len(workers)])

    def action_follow_all(self) -> None:
        self._follow(None)

    def action_toggle_wrap(self) -> None:
        pane = self.query_one(LogPane)
        pane.set_wrap(not pane.wrap)
        self._show_log_status()

    def action_first_failure(self) -> None:
        text = first_failure_text(self.snapshot)
        if text is None:
            self.notices.show("key", "nothing has failed in this run")
            return
        self.app.push_screen(FullTextModal(f"run {self.run_id}: first failure", text))

    def action_worker_error(self) -> None:
        if self.snapshot is None:
            return
        worker = self.worker if self.worker is not None else self.snapshot.first_failure
        row = self.snapshot.row(worker) if worker is not None else None
        if row is None:
            self.notices.show("key", "follow a worker first (0-9, tab): enter shows its last error",
                              severity="warning")
            return
        self.app.push_screen(FullTextModal(f"worker {row.worker} of {self.run_id}", worker_text(row)))

    def action_toggle_follow(self) -> None:
        pane = self.query_one(LogPane)
        pane.set_follow(not pane.follow)
        self._show_log_status()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # `/` has priority over every widget: typed into the open search prompt, it is just a character.
        return not (action == "search" and self.query_one(LogSearch).has_focus)

    def action_search(self) -> None:
        self.query_one(TabbedContent).active = TABS["logs"]
        self.query_one(LogSearch).open(self.query_one(LogPane).search_term)

    def action_stop_run(self) -> None:
        if self.snapshot is not None and self.snapshot.ended:
            self.notices.show("key", f"{self.run_id} has ended already ({self.snapshot.state})",
                              severity="warning")
            return
        hung = self.snapshot.hung if self.snapshot is not None else ()
        why = (
            f"Worker(s) {', '.join(map(str, hung))} still run after worker {self.snapshot.first_failure} "
            "failed. "
            if hung and self.snapshot is not None
            else ""
        )
        question = f"{why}Stop run {self.run_id} (TERM, then KILL after 10 s, on every worker)?"
        if theirs := self._theirs():  # another person's run: its id typed back, as `stop` asks
            self.app.push_screen(StopTheirsModal(self.run_id, theirs, question),
                                 lambda yes: self._stop_run() if yes else None)
            return
        self.app.push_screen(ConfirmModal(question, "Stop"), lambda yes: self._stop_run() if yes else None)

    @work(exclusive=True, group="run-stop", exit_on_error=False)
    async def _stop_run(self) -> None:
        self.notices.show("stop", f"stopping {self.run_id}...", title="stop", timeout=60)
        try:
            outcome = await self.feed.stop_run()
        except Exception as exc:  # noqa: BLE001 - shown; the run is as it was
            self.notices.show("stop", f"could not stop {self.run_id}: {one_line(exc)}", title="stop",
                              severity="error")
        else:
            self.notices.show("stop", outcome, title="stop")

    def action_stacks(self) -> None:
        if self.snapshot is not None and self.snapshot.ended:
            self.notices.show("key", f"{self.run_id} has ended: no job to ask for its stacks",
                              severity="warning")
            return
        self.app.push_screen(StacksModal(self.run_id, self.feed.stacks))

    def action_next_match(self, step: int) -> None:
        self.query_one(LogPane).next_match(step)
        self._show_log_status()

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = TABS[tab]

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if isinstance(event.input, LogSearch):
            event.stop()
            self.query_one(LogPane).search(event.value.strip())
            event.input.action_close()
            self._show_log_status()

    def on_log_search_closed(self, _message: LogSearch.Closed) -> None:
        self.query_one(LogPane).focus()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id in (TABS["steps"], TABS["plots"]):
            self._show_steps()
        elif event.pane.id == TABS["hbm"]:
            self._show_hbm()
        elif event.pane.id == TABS["logs"] and not self.query_one(LogSearch).has_class("-open"):
            self.query_one(LogPane).focus()
        # libtpu's metrics are read while someone looks at them: each reading starts a process per worker.
        if event.pane.id == TABS["hbm"]:
            self._follow_devices()
        else:
            self.workers.cancel_group(self, "run-devices")

    # -- drawing ---------------------------------------------------------------------------------------

    def run_workers(self) -> list[int]:
        if self.snapshot is not None:
            return [w.worker for w in self.snapshot.workers]
        return sorted(self.query_one(LogPane).by_worker)

    def _worker_range(self) -> str:
        workers = self.run_workers()
        return f"{workers[0]}-{workers[-1]}" if workers else "not known yet"

    def _follow(self, worker: int | None) -> None:
        self.worker = worker
        self.query_one(LogPane).show_worker(worker)
        self.query_one(WorkerGrid).select(worker)
        self._show_hbm()
        self._show_steps()
        self._show_log_status()

    def _show_steps(self) -> None:
        # Only the tab on screen is drawn (a 64-worker run brings several updates a second); the others
        # are drawn when they are shown (on_tabbed_content_tab_activated).
        self._steps_pending = False
        active = self.query_one(TabbedContent).active
        if active == TABS["steps"]:
            self._stragglers_drawn = self._stragglers()
            self.query_one(StepBreakdown).show(
                self.history.latest_by_worker(), self.worker, self._stragglers_drawn, self._steps_note()
            )
        elif active == TABS["plots"]:
            self.query_one(MetricPlots).show(self.history, self.worker, self._steps_note())

    def _steps_note(self) -> str | None:
        """A command job's: where its steps come from, or that none of its output matched."""
        return self.snapshot.steps_note if self.snapshot else None

    def _stragglers(self) -> dict[int, str]:
        """The watcher's straggler findings, by worker."""
        return {w.worker: w.straggler for w in self.snapshot.workers if w.straggler} if self.snapshot else {}

    def _show_hbm(self) -> None:
        if self.query_one(TabbedContent).active == TABS["hbm"]:
            self.query_one(HbmPanel).show(self.snapshot, self.worker, self.devices)

    def _show_header(self) -> None:
        self.query_one(RunHeader).show(self.run_id, self.snapshot, self.problem, self._theirs())

    def _theirs(self) -> str | None:
        """Whose run this is when another person launched it (launch.json's launched_by), else None;
        read from the history once."""
        if self._launched_by is None:
            try:
                self._launched_by = (self._store or RunStore()).get(self.run_id).launched_by or {}
            except NotFound:
                self._launched_by = {}
        return None if ownership.is_mine(self._launched_by) else ownership.describe(self._launched_by)

    def _show_log_status(self) -> None:
        self.query_one(LogStatus).show(self.query_one(LogPane), len(self.run_workers()))
