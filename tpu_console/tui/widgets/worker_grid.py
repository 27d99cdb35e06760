"""The run's workers, one row each: state, step, last step time, exit status, last line of output.

The first failure is marked, a stall and a straggler are coloured like nvitop colours a busy GPU, and the
row of the worker the dashboard follows carries the cursor.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow, slowness, slowness_level

LEVEL_STYLE = {"ok": "", "warn": "yellow", "bad": "bold red"}
COLUMNS = ("W", "STATE", "STEP", "STEP TIME", "EXIT", "LAST LINE")


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

    def on_mount(self) -> None:
        for column in COLUMNS:
            self.add_column(column, key=column)

    def show(self, snapshot: RunSnapshot, selected: int | None) -> None:
        step_times = {w.worker: w.step_s for w in snapshot.workers if w.step_s is not None and not w.failed}
        ratios = slowness(step_times)
        rows = [self._cells(w, snapshot.first_failure, ratios.get(w.worker)) for w in snapshot.workers]
        order = [w.worker for w in snapshot.workers]
        if order != self._order:
            self.clear()
            for worker, cells in zip(order, rows, strict=True):
                self.add_row(*cells, key=str(worker))
            self._order = order
        else:
            for worker, cells in zip(order, rows, strict=True):
                for column, value in zip(COLUMNS, cells, strict=True):
                    self.update_cell(str(worker), column, value)
        self.select(selected)

    def select(self, worker: int | None) -> None:
        """Put the cursor on `worker`'s row (none when following every worker)."""
        self.show_cursor = worker is not None
        if worker is not None and str(worker) in self.rows:
            self.move_cursor(row=self.get_row_index(str(worker)), animate=False)

    @staticmethod
    def _cells(row: WorkerRow, first_failure: int | None, ratio: float | None) -> tuple[Text, ...]:
        marker = "!" if row.worker == first_failure else " "
        worker = Text(f"{row.worker}{marker}", style="bold red" if marker == "!" else "")
        return (
            worker,
            state_text(row, row.worker == first_failure),
            Text("-" if row.step is None else str(row.step), justify="right"),
            step_time_text(row.step_s, ratio),
            exit_text(row.exit_status),
            Text(row.error or row.last_line or (row.reason or ""), no_wrap=True, overflow="ellipsis",
                 style="red" if row.error else "dim" if not row.last_line else ""),
        )


def state_text(row: WorkerRow, first_failure: bool) -> Text:
    if row.stalled:
        return Text(f"stalled {format_age(row.stalled_s or 0)}", style="bold yellow")
    if row.state == "exited":
        if row.exit_status == 0:
            return Text("exited", style="green")
        return Text("FAILED first" if first_failure else "failed", style="bold red" if first_failure else "red")
    if row.state == "lost":
        return Text("lost first" if first_failure else "lost", style="bold red" if first_failure else "red")
    if row.state == "running":
        return Text("running", style="cyan")
    return Text(row.state, style="dim")


def step_time_text(step_s: float | None, ratio: float | None) -> Text:
    if step_s is None:
        return Text("-", justify="right")
    level = slowness_level(ratio)
    label = f"{step_s:.2f}s" + (f" {ratio:.1f}x" if level != "ok" and ratio is not None else "")
    return Text(label, style=LEVEL_STYLE[level], justify="right")


def exit_text(exit_status: int | None) -> Text:
    if exit_status is None:
        return Text("-", justify="right", style="dim")
    return Text(str(exit_status), justify="right", style="green" if exit_status == 0 else "bold red")


def format_age(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
