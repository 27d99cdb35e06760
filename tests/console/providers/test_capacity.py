"""The capacity record's arithmetic: what counts as an attempt, the median wait, preemptions per
node-hour, and the order `--zones auto` gives (pure functions over attempts; the store round trip)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.providers import capacity

NOW = datetime(2026, 11, 24, 12, tzinfo=UTC)


def attempt(zone: str, outcome: str | None, *, ready_after_s: float | None = None, hours_ago: float = 10,
            preempted_after_s: float | None = None, provisioning: str = "spot",
            accelerator_type: str = "v6e-16") -> capacity.Attempt:
    return capacity.Attempt("gcp", "p", zone, accelerator_type, provisioning, "queued", "n",
                            NOW - timedelta(hours=hours_ago), outcome, None, ready_after_s, ready_after_s,
                            preempted_after_s)


def test_neutral_outcomes_are_not_attempts_and_waits_are_medians():
    records = capacity.summarize([
        attempt("a", capacity.READY, ready_after_s=60),
        attempt("a", capacity.READY, ready_after_s=600),
        attempt("a", capacity.READY, ready_after_s=120),
        attempt("a", capacity.CAPACITY),
        attempt("a", capacity.CANCELLED),
        attempt("a", capacity.LOST_RACE),
        attempt("a", None),  # still under way
    ], NOW)
    (record,) = records
    assert (record.attempts, record.successes, record.median_wait_s) == (4, 3, 120)
    assert record.success_rate == 0.75


def test_preemptions_per_node_hour_count_spot_hours_until_preemption_or_now():
    records = capacity.summarize([
        attempt("a", capacity.READY, ready_after_s=0, hours_ago=10, preempted_after_s=2 * 3600),
        attempt("a", capacity.READY, ready_after_s=0, hours_ago=6),  # still up: 6 hours so far
        attempt("a", capacity.READY, ready_after_s=0, hours_ago=6, provisioning="on-demand"),  # not spot
    ], NOW)
    (record,) = records
    assert record.preemptions == 1 and record.spot_node_hours == pytest.approx(8)
    assert record.preemptions_per_node_hour == pytest.approx(1 / 8)
    assert capacity.summarize([attempt("b", capacity.CAPACITY)], NOW)[0].preemptions_per_node_hour is None


def test_auto_order_puts_proven_zones_first_then_untried_then_unlucky():
    records = capacity.summarize([
        attempt("slow", capacity.READY, ready_after_s=3000),
        attempt("fast", capacity.READY, ready_after_s=60),
        attempt("flaky", capacity.READY, ready_after_s=10),
        attempt("flaky", capacity.CAPACITY),
        attempt("dry", capacity.CAPACITY),
        attempt("dry", capacity.CAPACITY),
        attempt("other-type", capacity.READY, ready_after_s=1, accelerator_type="v5p-8"),
    ], NOW)
    configured = ["dry", "new-1", "slow", "fast", "new-2", "flaky", "other-type"]
    assert capacity.order_zones(configured, records, "v6e-16") == [
        "fast", "slow", "flaky", "new-1", "new-2", "other-type", "dry"]


@pytest.mark.usefixtures("console_home")
def test_the_store_round_trip_and_a_preemption_marked_once():
    store = capacity.CapacityStore()
    first = attempt("a", None, hours_ago=2)
    store.finish(store.start(first), capacity.READY, ready_after_s=600.0, active_after_s=300.0)
    assert store.mark_preempted("p", "a", "n", NOW) is True
    assert store.mark_preempted("p", "a", "n", NOW + timedelta(hours=1)) is False  # already known
    (saved,) = store.attempts("v6e-16", "p")
    assert (saved.outcome, saved.active_after_s, saved.ready_after_s) == ("ready", 300.0, 600.0)
    assert saved.preempted_after_s == pytest.approx(2 * 3600 - 600)
    assert store.attempts("v5p-8") == []
