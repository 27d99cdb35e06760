"""What a run cost: the node's price when launched, times the run's hours; kept in the history and shown in
`runs` and `runs compare`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.fixtures_cli import NOW, console_home, make_node  # noqa: F401 - fixture
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.history.summary import COST, compare_rows
from tpu_console.pricing import price_per_hour, run_cost


def test_run_cost_is_price_times_hours_to_the_end_or_to_now():
    assert run_cost(10.0, NOW - timedelta(hours=2), NOW - timedelta(minutes=30)) == pytest.approx(15.0)
    assert run_cost(10.0, NOW - timedelta(minutes=6), None, now=NOW) == pytest.approx(1.0)
    assert run_cost(None, NOW - timedelta(hours=2), NOW) is None  # local pods have no price


@pytest.mark.usefixtures("console_home")
def test_the_price_is_kept_with_the_run_and_compared():
    node = make_node("pod", "gcp", spot=True)
    price = price_per_hour(node).per_hour
    store = RunStore()
    for run_id, hours in (("20250101-000000-aaaa", 1), ("20250101-000000-bbbb", 2)):
        store.add(RunRecord(run_id=run_id, node="pod", provider="gcp", accelerator_type="v6e-16", workers=[0],
                            config_path="c.yaml", config_digest="d", overrides=[], python="python3",
                            started_at=NOW - timedelta(hours=hours), finished_at=NOW, price_per_hour=price))
    a, b = store.get("20250101-000000-aaaa"), store.get("20250101-000000-bbbb")
    assert a.price_per_hour == pytest.approx(price)
    costs = [run_cost(r.price_per_hour, r.started_at, r.finished_at) for r in (a, b)]
    (row,) = [
        r for r in compare_rows([a.run_id, b.run_id], [{COST: c} for c in costs]) if r["metric"] == COST
    ]
    assert row["values"][a.run_id] == pytest.approx(price) and row["change_pct"][b.run_id] == pytest.approx(
        100.0
    )
