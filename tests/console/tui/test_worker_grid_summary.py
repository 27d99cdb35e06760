"""The run dashboard's worker grid for a large run: a row per state with the odd ones out named, rather than
a row per worker to scroll."""

from __future__ import annotations

from datetime import UTC, datetime

from textual.app import App, ComposeResult

from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow
from tpu_console.tui.widgets.worker_grid import MAX_NAMED, WorkerGrid, worker_ranges


def snapshot(rows: list[WorkerRow], first_failure: int | None = None) -> RunSnapshot:
    return RunSnapshot("r", "pod", "partially-dead", tuple(rows), datetime.now(UTC),
                       first_failure=first_failure)


def big_run(workers: int = 256) -> RunSnapshot:
    rows = [WorkerRow(w, "running", step=120, step_s=2.0, last_line=f"step 120 w{w}") for w in range(workers)]
    rows[17] = WorkerRow(17, "exited", exit_status=1, failed=True, error="out of HBM")
    rows[3] = WorkerRow(3, "stalled", step=100, step_s=2.0, step_age_s=300.0)
    rows[99] = WorkerRow(99, "compiling", for_s=40.0)
    rows[200] = WorkerRow(200, "running", step=120, step_s=6.0, straggler="step 6.0s vs median 2.0s (3.0x)")
    return snapshot(rows, first_failure=17)


class GridApp(App):
    def compose(self) -> ComposeResult:
        yield WorkerGrid()


def cells(grid: WorkerGrid) -> list[list[str]]:
    return [[str(cell) for cell in grid.get_row_at(i)] for i in range(grid.row_count)]


async def test_a_large_run_shows_states_and_names_the_odd_ones_out():
    app = GridApp()
    async with app.run_test(size=(120, 30)) as pilot:
        grid = app.query_one(WorkerGrid)
        grid.show(big_run(), None)
        await pilot.pause()
        rows = cells(grid)
        assert rows[0][:5] == ["*", "252 running", "120", "2.00s", "-"]
        assert rows[0][5] == "workers 0-2,4-16,18-98,100-199,201-255"
        # the worst first: the first failure, then the stall, the straggler, the worker in a rare state
        assert [r[0].strip() for r in rows[1:]] == ["17!", "3", "200", "99"]
        assert rows[1][1] == "FAILED first" and rows[1][5] == "out of HBM"
        assert grid.show_cursor is False

        grid.select(42)  # the worker followed gets a row of its own, with the cursor
        await pilot.pause()
        rows = cells(grid)
        assert rows[0][1] == "251 running" and rows[-1][0].strip() == "42"
        assert grid.cursor_row == len(rows) - 1 and grid.show_cursor


async def test_past_max_named_the_odd_ones_are_counted_in_their_state():
    rows = [WorkerRow(w, "running", step=5, step_s=1.0) for w in range(64)]
    for w in range(20):
        rows[w] = WorkerRow(w, "exited", exit_status=1, failed=True)
    app = GridApp()
    async with app.run_test(size=(120, 30)) as pilot:
        grid = app.query_one(WorkerGrid)
        grid.show(snapshot(rows, first_failure=5), None)
        await pilot.pause()
        shown = cells(grid)
        named = [r[0].strip() for r in shown if r[0] != "*"]
        assert len(named) == MAX_NAMED and named[0] == "5!"
        states = {r[1]: r[5] for r in shown if r[0] == "*"}
        assert states["44 running"] == "workers 20-63"
        assert "12 failed" in states


async def test_a_small_run_keeps_a_row_per_worker():
    rows = [WorkerRow(w, "running", step=1, step_s=1.0) for w in range(16)]
    app = GridApp()
    async with app.run_test(size=(120, 30)) as pilot:
        grid = app.query_one(WorkerGrid)
        grid.show(snapshot(rows), 3)
        await pilot.pause()
        assert grid.row_count == 16 and grid.cursor_row == 3


def test_worker_ranges():
    assert worker_ranges([5, 0, 1, 2, 7, 8, 10]) == "0-2,5,7-8,10"
    assert worker_ranges([]) == ""
