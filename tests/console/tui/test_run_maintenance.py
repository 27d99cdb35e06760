"""The run dashboard's warning when the run's node has maintenance announced while the run runs, is
unhealthy, or has symptoms."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from tests.fixtures_cli import NOW, FakeProvider, make_node
from tpu_console.domain import Maintenance
from tpu_console.history.store import RunRecord
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.run_snapshot import RunSnapshot
from tpu_console.tui.widgets.node_table import state_text
from tpu_console.tui.widgets.run_header import notes_text


def feed_on(maintenance: Maintenance | None, finished: bool = False, **node_fields) -> RunFeed:
    node = replace(make_node("pod"), maintenance=maintenance, **node_fields)
    feed = RunFeed({"fake": FakeProvider([node])}, "20250314-110000-abcd", clock=lambda: NOW)
    feed.record = RunRecord("20250314-110000-abcd", "pod", "fake", "v6e-16", [0, 1, 2, 3], "c.yaml", "d", [],
                            "python", NOW - timedelta(hours=1),
                            finished_at=NOW - timedelta(minutes=30) if finished else None)
    return feed


async def test_maintenance_during_the_run_is_a_warning_in_the_header():
    window = Maintenance("SCHEDULED", "PENDING", NOW + timedelta(hours=2), NOW + timedelta(hours=3))
    feed = feed_on(window)
    await feed.check_node(every_s=0)
    assert feed.node_warning == ("maintenance SCHEDULED PENDING 2025-03-14 14:00-15:00 UTC on pod, "
                                 "while this run runs: checkpoint before it")
    snapshot = RunSnapshot("20250314-110000-abcd", "pod", "running", (), NOW, node_warning=feed.node_warning)
    assert "maintenance SCHEDULED PENDING" in notes_text(snapshot, None).plain


async def test_no_warning_without_maintenance_or_after_the_run_ended():
    feed = feed_on(None)
    await feed.check_node(every_s=0)
    assert feed.node_warning is None
    later = Maintenance("SCHEDULED", "PENDING", NOW + timedelta(hours=2), NOW + timedelta(hours=3))
    feed = feed_on(later, finished=True)
    await feed.check_node(every_s=0)
    assert feed.node_warning is None


async def test_an_unhealthy_node_and_its_symptoms_are_a_warning_in_the_header():
    feed = feed_on(None, health="UNHEALTHY_MAINTENANCE",
                   symptoms=("HBM_OUT_OF_MEMORY (worker 0): chip 2 reports an HBM error",))
    await feed.check_node(every_s=0)
    assert feed.node_warning == ("pod health UNHEALTHY_MAINTENANCE; symptom HBM_OUT_OF_MEMORY (worker 0): "
                                 "chip 2 reports an HBM error")
    feed = feed_on(None, health="HEALTHY")
    await feed.check_node(every_s=0)
    assert feed.node_warning is None


def test_the_nodes_table_marks_health_symptoms_and_maintenance_after_the_state():
    window = Maintenance("SCHEDULED", "PENDING", NOW + timedelta(hours=2), NOW + timedelta(hours=3))
    node = replace(make_node("pod"), health="UNHEALTHY_MAINTENANCE", symptoms=("HBM_OUT_OF_MEMORY",),
                   maintenance=window)
    assert state_text(node).plain == "READY maint symptom maint due"
    assert state_text(replace(make_node("pod"), health="HEALTHY")).plain == "READY ok"
    assert state_text(make_node("pod")).plain == "READY"  # local and ssh report no health
