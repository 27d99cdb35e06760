"""The run's workers, one row each: state, step, last step time, exit status, last line of output.

The state is the watcher's judgement of the worker (runs/health.py): starting, compiling, running,
stalled, exited, stopped (by a stop asked for), lost, unreachable, and HUNG for a worker still running
after another one failed. The first failure is marked, a stall and a straggler are coloured like nvitop
colours a busy GPU, a worker whose log matched a known problem (out of HBM, TPU in use ...) shows it in
place of its last line, and the row of the worker the dashboard follows carries the cursor. Cells are
rewritten only when they change.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from tpu_console.runs.signatures import EXCEPTION
from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow, slowness

HUNG_STYLE = "bold white on red"
COLUMNS = ("W", "STATE", "STEP", "STEP TIME", "EXIT", "LAST LINE")
# Fixed widths for the widest value each column shows ("63!", "compiling 119s", "123.45s 1.5x", "143"), so
# no state is cut off and nothing jumps as values change; LAST LINE takes the rest of the width.
WIDTHS = {"W": 3, "STATE": 14, "STEP": 6, "STEP TIME": 12, "EXIT": 4}
LAST_LINE_MIN = 20


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
        self._order: list[int] = []
        self._cells: dict[int, tuple[Text, ...]] = {}  # what each row shows now
        self._selected: int | None = None

    def on_mount(self) -> None:
        self._add_columns(LAST_LINE_MIN)

    def on_resize(self) -> None:
        # scrollbar
        last_line = self.size.width - sum(WIDTHS.values()) - 2 * self.cell_padding * len(COLUMNS) - 1
        last_line = max(LAST_LINE_MIN, last_line)
        if self.columns["LAST LINE"].width != last_line:  # type: ignore[index] - keyed by the column's name
            self.clear(columns=True)
            self._add_columns(last_line)
            for worker in self._order:
                self.add_row(*self._cells[worker], key=str(worker))
            self.select(self._selected)

    def _add_columns(self, last_line: int) -> None:
        for column in COLUMNS:
            self.add_column(column, key=column, width=WIDTHS.get(column, last_line))

    def show(self, snapshot: RunSnapshot, selected: int | None) -> None:
        step_times = {w.worker: w.step_s for w in snapshot.workers if w.step_s is not None and not w.failed}
        ratios = slowness(step_times)
        rows = [row_cells(w, snapshot.first_failure, ratios.get(w.worker)) for w in snapshot.workers]
        order = [w.worker for w in snapshot.workers]
        if order != self._order:
            self.clear()
            for worker, cells in zip(order, rows, strict=True):
                self.add_row(*cells, key=str(worker))
            self._order = order
        else:
            for worker, cells in zip(order, rows, strict=True):
                for column, value, was in zip(COLUMNS, cells, self._cells[worker], strict=True):
                    if not same_cell(value, was):
                        self.update_cell(str(worker), column, value)
        self._cells = dict(zip(order, rows, strict=True))
        self.select(selected)

    def select(self, worker: int | None) -> None:
        """Put the cursor on `worker`'s row (none when following every worker)."""
        self._selected = worker
        self.show_cursor = worker is not None
        if worker is not None and str(worker) in self.rows:
            self.move_cursor(row=self.get_row_index(str(worker)), animate=False)


def row_cells(row: WorkerRow, first_failure: int | None, ratio: float | None) -> tuple[Text, ...]:
    """The cells of one worker's row; `ratio`: its step time over the other workers' median."""
    marker = "!" if row.worker == first_failure else " "
    worker = Text(f"{row.worker}{marker}", style="bold red" if marker == "!" else "")
    note, style = row_note(row)
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
