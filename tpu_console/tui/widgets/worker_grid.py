"""The run's workers, one row each: state, step, last step time, exit status, last line of output.

The state is the watcher's judgement of the worker (observe/health.py): starting, compiling, running,
stalled, exited, stopped (by a stop asked for), lost, unreachable, and HUNG for a worker still running
after another one failed. The first failure is marked, a stall and a straggler are coloured like nvitop
colours a busy GPU, a worker whose log matched a known problem (out of HBM, TPU in use ...) shows it in
place of its last line, and the row of the worker the dashboard follows carries the cursor. Cells are
rewritten only when they change.

Past SUMMARY_AFTER workers (a v6e-256 is 64 hosts, four v6e-256 slices 256) a row per worker is a list
to scroll, not something read at a glance: the grid then shows one row per state ("250 running",
"3 compiling", with the workers' ranges, the median step and step time) and names the odd ones out in
rows of their own, the worst first: the first failure, hung, failed, lost or unreachable, stalled,
stragglers, workers whose log shows a problem, then those in a state few others share, and always the
worker the dashboard follows (MAX_NAMED at most; the rest are counted in their state's row).
"""

from __future__ import annotations

import statistics

from rich.text import Text
from textual.widgets import DataTable

from tpu_console.observe.signatures import EXCEPTION
from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow, slowness
from tpu_console.views.runs import worker_ranges

HUNG_STYLE = "bold white on red"
COLUMNS = ("W", "STATE", "STEP", "STEP TIME", "EXIT", "LAST LINE")
# Fixed widths for the widest value each column shows ("63!", "compiling 119s", "123.45s 1.5x", "143"), so
# no state is cut off and nothing jumps as values change; LAST LINE takes the rest of the width.
WIDTHS = {"W": 3, "STATE": 14, "STEP": 6, "STEP TIME": 12, "EXIT": 4}
LAST_LINE_MIN = 20
SUMMARY_AFTER = 16  # more workers than this: a row per state, and the odd ones out named
MAX_NAMED = 8


class WorkerGrid(DataTable):
    DEFAULT_CSS = """
    WorkerGrid {
        height: auto;
        max-height: 10;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, show_cursor=True, **kwargs)
        self.can_focus = False  # keys belong to the dashboard; the cursor shows who is followed
        self._order: list[str] = []  # row keys: a worker's number, or "state:<label>" for a summary row
        self._cells: dict[str, tuple[Text, ...]] = {}  # what each row shows now
        self._selected: int | None = None
        self._snapshot: RunSnapshot | None = None

    def on_mount(self) -> None:
        self._add_columns(LAST_LINE_MIN)

    def on_resize(self) -> None:
        # scrollbar
        last_line = self.size.width - sum(WIDTHS.values()) - 2 * self.cell_padding * len(COLUMNS) - 1
        last_line = max(LAST_LINE_MIN, last_line)
        if self.columns["LAST LINE"].width != last_line:  # type: ignore[index] - keyed by the column's name
            self.clear(columns=True)
            self._add_columns(last_line)
            for key in self._order:
                self.add_row(*self._cells[key], key=key)
            self._place_cursor()

    def _add_columns(self, last_line: int) -> None:
        for column in COLUMNS:
            self.add_column(column, key=column, width=WIDTHS.get(column, last_line))

    @property
    def summarized(self) -> bool:
        """Rows per state rather than per worker (a large run)."""
        return self._snapshot is not None and len(self._snapshot.workers) > SUMMARY_AFTER

    def show(self, snapshot: RunSnapshot, selected: int | None) -> None:
        self._snapshot, self._selected = snapshot, selected
        step_times = {w.worker: w.step_s for w in snapshot.workers if w.step_s is not None and not w.failed}
        ratios = slowness(step_times)
        if self.summarized:
            rows = summary_rows(snapshot, selected, ratios)
        else:
            rows = [(str(w.worker), row_cells(w, snapshot.first_failure, ratios.get(w.worker)))
                    for w in snapshot.workers]
        order = [key for key, _ in rows]
        if order != self._order:
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
            self._order = order
        else:
            for key, cells in rows:
                for column, value, was in zip(COLUMNS, cells, self._cells[key], strict=True):
                    if not same_cell(value, was):
                        self.update_cell(key, column, value)
        self._cells = dict(rows)
        self._place_cursor()

    def select(self, worker: int | None) -> None:
        """Put the cursor on `worker`'s row (none when following every worker). Summarized, the worker
        followed is named in a row of its own, so the rows are made again."""
        if self.summarized and worker != self._selected and self._snapshot is not None:
            self.show(self._snapshot, worker)
            return
        self._selected = worker
        self._place_cursor()

    def _place_cursor(self) -> None:
        worker = self._selected
        self.show_cursor = worker is not None
        if worker is not None and str(worker) in self.rows:
            self.move_cursor(row=self.get_row_index(str(worker)), animate=False)


def odd_one_out(row: WorkerRow, first_failure: int | None, usual: str) -> int | None:
    """How much a worker deserves a row of its own in a summarized grid (lower: more), or None when its
    state's row says enough. `usual`: the state most workers are in."""
    if row.worker == first_failure:
        return 0
    if row.hung:
        return 1
    if row.failed:
        return 2
    if row.activity in ("lost", "unreachable"):
        return 3
    if row.stalled:
        return 4
    if row.straggler is not None:
        return 5
    if row.problem or row.error:
        return 6
    if state_label(row) != usual:
        return 7
    return None


def summary_rows(
    snapshot: RunSnapshot, selected: int | None, ratios: dict[int, float]
) -> list[tuple[str, tuple[Text, ...]]]:
    """One row per state for the workers not named, then the odd ones out (and the worker followed), each
    in a row of its own."""
    labels = {row.worker: state_label(row) for row in snapshot.workers}
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    usual = max(counts, key=lambda label: counts[label])
    ranked = sorted(
        (rank, row.worker) for row in snapshot.workers
        if (rank := odd_one_out(row, snapshot.first_failure, usual)) is not None
    )
    named = [worker for _, worker in ranked[:MAX_NAMED]]
    if selected is not None and selected in labels and selected not in named:
        named.append(selected)
    named_set = set(named)
    groups: dict[str, list[WorkerRow]] = {}
    for row in snapshot.workers:
        if row.worker not in named_set:
            groups.setdefault(labels[row.worker], []).append(row)
    rows = [(f"state:{label}", group_cells(label, members))
            for label, members in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))]
    by_worker = {row.worker: row for row in snapshot.workers}
    for worker in named:
        row = by_worker[worker]
        rows.append((str(worker), row_cells(row, snapshot.first_failure, ratios.get(worker))))
    return rows


def state_label(row: WorkerRow) -> str:
    """The state a worker is counted under in a summarized grid: its activity, with a failed exit apart."""
    if row.hung:
        return "HUNG"
    if row.activity == "exited" and row.exit_status != 0:
        return "failed"
    return row.activity


def group_cells(label: str, members: list[WorkerRow]) -> tuple[Text, ...]:
    """A summary row: how many workers are in this state, their median step and step time, and which."""
    first = members[0]
    style = state_text(first, first_failure=False).style
    steps = [m.step for m in members if m.step is not None]
    step_times = [m.step_s for m in members if m.step_s is not None]
    exits = {m.exit_status for m in members}
    step = Text("-" if not steps else str(int(statistics.median_low(steps))), justify="right")
    step_time = step_time_text(statistics.median(step_times) if step_times else None, None, False)
    exit_status = exit_text(exits.pop() if len(exits) == 1 else None, first.stopped)
    which = f"workers {worker_ranges([m.worker for m in members])}"
    return (
        Text("*", style="dim"),
        Text(f"{len(members)} {label}", style=style, no_wrap=True, overflow="ellipsis"),
        step,
        step_time,
        exit_status,
        Text(which, no_wrap=True, overflow="ellipsis", style="dim"),
    )


def row_cells(row: WorkerRow, first_failure: int | None, ratio: float | None) -> tuple[Text, ...]:
    """The cells of one worker's row; `ratio`: its step time over the other workers' median."""
    marker = "!" if row.worker == first_failure else " "
    worker = Text(f"{row.worker}{marker}", style="bold red" if marker == "!" else "")
    note, style = row_note(row)
    if row.slice is not None:  # a multislice run: which slice the odd one out is in
        note = f"slice {row.slice} · {note}"
    return (
        worker,
        state_text(row, row.worker == first_failure),
        Text("-" if row.step is None else str(row.step), justify="right"),
        step_time_text(row.step_s, ratio, row.straggler is not None),
        exit_text(row.exit_status, row.stopped),
        Text(note, no_wrap=True, overflow="ellipsis", style=style),
    )


def same_cell(a: Text, b: Text) -> bool:
    # Text's own == compares the characters and spans only, not the style of the whole cell.
    return a.plain == b.plain and a.style == b.style and a.spans == b.spans


def row_note(row: WorkerRow) -> tuple[str, str]:
    """The last column: what went wrong when something did (a known log signature first, with its fix;
    then the trainer's error event; then a bare traceback line), else the last line of output."""
    specific = row.problem is not None and row.problem_kind != EXCEPTION
    for text in (row.problem if specific else None, row.error, row.problem):
        if text:
            return text, "yellow" if row.stopped else "red"
    if row.last_line:
        return row.last_line, ""
    return row.reason or "", "dim"


def state_text(row: WorkerRow, first_failure: bool) -> Text:
    """The watcher's activity of the worker, as a person reads it at a glance."""
    if row.hung:
        return Text("HUNG", style=HUNG_STYLE)
    if row.stalled:
        return Text(f"stalled {format_age(row.step_age_s or 0)}", style="bold yellow")
    if row.activity == "stopped":
        return Text("stopped", style="yellow")
    if row.activity == "exited":
        if row.exit_status == 0:
            return Text("exited", style="green")
        if first_failure:
            return Text("FAILED first", style="bold red")
        return Text("failed", style="red")
    if row.activity == "lost":
        return Text("lost first" if first_failure else "lost", style="bold red" if first_failure else "red")
    if row.activity == "unreachable":
        return Text("unreachable", style="bold yellow")
    if row.activity == "running":
        return Text("running", style="cyan")
    if row.activity == "compiling":
        return Text(f"compiling {format_age(row.for_s)}", style="cyan")
    return Text(row.activity, style="dim")


def step_time_text(step_s: float | None, ratio: float | None, straggler: bool) -> Text:
    """The last step time; a straggler's (as the watcher judged it: its step or one phase is slow) in
    red, with its step time over the other workers' median when that is what is slow."""
    if step_s is None:
        return Text("-", justify="right")
    if not straggler:
        return Text(f"{step_s:.2f}s", justify="right")
    slower = f" {ratio:.1f}x" if ratio is not None and ratio >= 1.05 else ""
    return Text(f"{step_s:.2f}s{slower}", style="bold red", justify="right")


def exit_text(exit_status: int | None, stopped: bool = False) -> Text:
    if exit_status is None:
        return Text("-", justify="right", style="dim")
    style = "green" if exit_status == 0 else "yellow" if stopped else "bold red"
    return Text(str(exit_status), justify="right", style=style)


def format_age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
