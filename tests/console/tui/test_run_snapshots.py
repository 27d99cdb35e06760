"""Snapshot tests of the run dashboard at 100x30 with fixed data: a running 4-worker run with a straggler
and a stall (each tab; libtpu's metrics in the HBM tab), a run hung after a failure, an ended failed run
(its log wrapped and cut, its first failure whole), a run stopped with `x`, and plots with one step.
Update after an intended change with `pytest tests/console/tui/test_run_snapshots.py --snapshot-update`,
and look at the report before committing."""

from __future__ import annotations

from tests.console.tui.fixtures_run_dashboard import FixedFeed, failed_run, hung_run, running_run, stopped_run
from tests.console.tui.test_run_screen import SIZE, DashboardApp


async def until_posted(pilot) -> None:
    await pilot.app.run_screen.feed.posted.wait()
    await pilot.pause()


def test_running_run_logs(snap_compare):
    assert snap_compare(DashboardApp(FixedFeed(*running_run())), terminal_size=SIZE, run_before=until_posted)


def test_running_run_one_worker_with_search(snap_compare):
    app = DashboardApp(FixedFeed(*running_run()))
    keys = ["2", "slash", *"step=1", "enter"]
    assert snap_compare(app, terminal_size=SIZE, run_before=until_posted, press=keys)


def test_running_run_step_breakdown(snap_compare):
    app = DashboardApp(FixedFeed(*running_run()))
    assert snap_compare(app, terminal_size=SIZE, run_before=until_posted, press=["2", "s"])


async def hbm_with_devices(pilot) -> None:
    await until_posted(pilot)
    await pilot.press("1", "m")
    await pilot.pause()  # libtpu's reading, posted once the tab is shown
    await pilot.pause()


def test_running_run_hbm(snap_compare):
    app = DashboardApp(FixedFeed(*running_run()))
    assert snap_compare(app, terminal_size=SIZE, run_before=hbm_with_devices)


def test_running_run_plots(snap_compare):
    app = DashboardApp(FixedFeed(*running_run()))
    assert snap_compare(app, terminal_size=SIZE, run_before=until_posted, press=["2", "p"])


def test_failed_run(snap_compare):
    assert snap_compare(DashboardApp(FixedFeed(*failed_run())), terminal_size=SIZE, run_before=until_posted)


def test_hung_run(snap_compare):
    assert snap_compare(DashboardApp(FixedFeed(*hung_run())), terminal_size=SIZE, run_before=until_posted)


def test_stopped_run(snap_compare):
    assert snap_compare(DashboardApp(FixedFeed(*stopped_run())), terminal_size=SIZE, run_before=until_posted)


def test_failed_run_first_failure_whole(snap_compare):
    app = DashboardApp(FixedFeed(*failed_run()))
    assert snap_compare(app, terminal_size=SIZE, run_before=until_posted, press=["e"])


def test_failed_run_log_cut_like_less_s(snap_compare):
    app = DashboardApp(FixedFeed(*failed_run()))
    assert snap_compare(app, terminal_size=SIZE, run_before=until_posted, press=["w"])


def test_plots_with_one_step(snap_compare):
    app = DashboardApp(FixedFeed(*stopped_run(steps=1)))
    assert snap_compare(app, terminal_size=SIZE, run_before=until_posted, press=["p"])
