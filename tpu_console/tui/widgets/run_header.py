"""The dashboard's top lines: which run, where, its state (the verdict once it ended); then what needs
attention first: workers hung after a failure (with the key that stops them), the first failure, the log
signature that explains it (out of HBM with the hint, TPU in use ...), a hung or stalled job, stragglers;
then the W&B URL, the run's goodput (history/goodput.py), and why the run could not be read when it could
not. What does not fit its line opens whole: `e` the first failure, `enter` the followed worker's last
error (first_failure_text, worker_text)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow

STATE_STYLE = {
    "pending": "dim",
    "running": "bold cyan",
    "succeeded": "bold green",
    "failed": "bold red",
    "stopped": "bold yellow",
    "partially-dead": "bold red",  # a worker failed while others still run
}
HUNG_STYLE = "bold white on red"


class RunHeader(Vertical):
    DEFAULT_CSS = """
    RunHeader {
        height: 2;
        padding: 0 1;
        background: $panel;
    }
    RunHeader Static {
        height: 1;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="run-title")
        yield Static(id="run-notes")

    def show(self, run_id: str, snapshot: RunSnapshot | None, problem: str | None,
             theirs: str | None = None) -> None:
        title = title_text(run_id, snapshot, problem)
        if theirs:  # another person's run: said first, before the ellipsis can cut it
            title = Text.assemble(Text(f"{theirs}'s ", style="bold magenta"), title, no_wrap=True,
                                  overflow="ellipsis")
        # a row each whatever they say: no layout of the screen for them (once a second on a large run)
        self.query_one("#run-title", Static).update(title, layout=False)
        self.query_one("#run-notes", Static).update(notes_text(snapshot, problem), layout=False)


def title_text(run_id: str, snapshot: RunSnapshot | None, problem: str | None) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"run {run_id}", style="bold")
    if snapshot is None:
        text.append("  reading the run..." if problem is None else "", style="dim")
    else:
        text.append(f" on {snapshot.node}  ")
        if snapshot.ended:
            text.append(f"ended: {snapshot.state.upper()}", style=STATE_STYLE.get(snapshot.state, "bold"))
        else:
            text.append(snapshot.state, style=STATE_STYLE.get(snapshot.state, ""))
        # A job that is starting or compiling is running too, as `status` and the nodes screen say.
        running = sum(w.activity in ("starting", "compiling", "running", "stalled") for w in snapshot.workers)
        exited = sum(w.activity in ("exited", "stopped") for w in snapshot.workers)
        steps = [w.step for w in snapshot.workers if w.step is not None]
        text.append(f"  {running} running, {exited} exited of {len(snapshot.workers)}", style="dim")
        if steps:
            text.append(f"  step {max(steps)}", style="dim")
        text.append(f"  at {snapshot.updated_at:%H:%M:%S}", style="dim")
    return text


def notes_text(snapshot: RunSnapshot | None, problem: str | None) -> Text:
    """The second line: what needs attention, most urgent first, then the W&B URL."""
    text = Text(no_wrap=True, overflow="ellipsis")
    notes: list[tuple[str, str]] = []
    if problem:
        notes.append((f"problem: {problem}", "bold yellow"))
    if snapshot is not None:
        notes.extend(attention(snapshot))
        if snapshot.wandb_url:
            notes.append((f"W&B {snapshot.wandb_url}", f"link {snapshot.wandb_url}"))
    if snapshot is not None and snapshot.goodput is not None:
        notes.append((snapshot.goodput.line(), "dim"))
    if not notes:
        notes.append(("no W&B URL (wandb disabled, or not started yet)", "dim"))
    for i, (note, style) in enumerate(notes):
        text.append("  ·  " if i else "", style="dim")
        text.append(note, style=style)
    return text


def attention(snapshot: RunSnapshot) -> list[tuple[str, str]]:
    """(note, style) for what the watcher found wrong with the run, most urgent first."""
    notes: list[tuple[str, str]] = []
    if snapshot.hung:
        after = f" after W{snapshot.first_failure} failed" if snapshot.first_failure is not None else ""
        notes.append((f" HUNG: {_workers(snapshot.hung)} still running{after}; x stops the run ", HUNG_STYLE))
    if snapshot.failure:
        notes.append((f"first failure: {snapshot.failure}", "bold red"))
    if (found := telling_problem(snapshot)) is not None:
        worker, message = found
        notes.append((f"W{worker} log: {message}", "bold red"))
    if snapshot.all_silent:
        notes.append(("every running worker is silent: the job looks hung", "bold yellow"))
    elif snapshot.stalled:
        notes.append((f"stalled: {_workers(snapshot.stalled)}", "bold yellow"))
    if snapshot.stragglers:
        # a pace over the last steps (observe/stragglers.py), short: "W13 1.8x" (its median step); whole in
        # the step breakdown
        rows = [row for w in snapshot.stragglers if (row := snapshot.row(w)) is not None and row.straggler]
        paced = [row.straggler.partition(" ")[0] for row in rows if "x the median step for" in row.straggler]
        said = f" {paced[0]}" if paced and len(snapshot.stragglers) == 1 else ""
        notes.append((f"stragglers: {_workers(snapshot.stragglers)}{said}", "yellow"))
    if snapshot.node_warning:
        notes.append((snapshot.node_warning, "bold yellow"))
    return notes


def telling_problem(snapshot: RunSnapshot) -> tuple[int, str] | None:
    """The log signature that best explains the run's trouble: the first failed worker's, else the first
    worker's that has one; None when no log matched a known problem."""
    first = snapshot.row(snapshot.first_failure) if snapshot.first_failure is not None else None
    if first is not None and first.problem:
        return first.worker, first.problem
    return next(((w.worker, w.problem) for w in snapshot.workers if w.problem), None)


def _workers(workers: tuple[int, ...]) -> str:
    return ",".join(f"W{w}" for w in workers)


def first_failure_text(snapshot: RunSnapshot | None) -> str | None:
    """The first failure whole, with what its worker's log says (`e`); None when nothing failed."""
    if snapshot is None or not snapshot.failure:
        return None
    lines = [snapshot.failure]
    if (found := telling_problem(snapshot)) is not None:
        lines.append(f"worker {found[0]}'s log: {found[1]}")
    first = snapshot.row(snapshot.first_failure) if snapshot.first_failure is not None else None
    if first is not None and first.traceback:
        lines.append(f"worker {first.worker}'s traceback:\n{first.traceback}")
    return "\n\n".join(lines)


def worker_text(row: WorkerRow) -> str:
    """Everything known of why a worker is where it is (enter on its row), whole."""
    state = row.activity if row.exit_status is None else f"{row.activity}, exit status {row.exit_status}"
    lines = [f"state: {state}"]
    for label, value in (("error", row.error), ("log", row.problem), ("why", row.reason),
                         ("last line", row.last_line)):
        if value:
            lines.append(f"{label}: {value}")
    if row.traceback:
        lines.append(f"traceback:\n{row.traceback}")
    if len(lines) == 1:
        lines.append("no error: nothing went wrong on this worker")
    return "\n\n".join(lines)
