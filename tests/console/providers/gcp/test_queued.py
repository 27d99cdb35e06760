"""Queued resources through the gcp provider, unmodified, against the TPU API emulator: waiting for
capacity, cancelling, racing zones, the fields sent, suspended requests, the capacity record."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home, make_provider  # noqa: F401 - fixtures
from tpu_console.domain import CreateRequest, NodeState, QueueState
from tpu_console.errors import CreateInterrupted, UserError
from tpu_console.providers import capacity

Z1, Z2, Z3 = ZONES


def queued(name: str = "grpo", zones=(Z1,), **fields) -> CreateRequest:
    return CreateRequest(name, fields.pop("accelerator_type", "v6e-16"), zones=zones, queued=True, **fields)


async def until(condition, what: str, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def attempts() -> list[tuple[str, str | None]]:
    return [(a.zone, a.outcome) for a in capacity.CapacityStore().attempts()]


async def test_a_queued_create_waits_for_capacity_then_shows_its_timeline(emulator, make_provider):
    emulator.capacity_after(Z1, 0.3)
    lines: list[str] = []

    node = await make_provider().create(queued(), lines.append)

    assert (node.name, node.zone, node.state, node.queued_request) == ("grpo", Z1, NodeState.READY, "grpo")
    timeline = [line.split(": ", 1)[1].split(" after ")[0] for line in lines[1:]]
    # CREATING may pass before the first look; every later state is seen, in order
    assert [line for line in timeline if line != "CREATING"] == [
        "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "node CREATING", "node READY"]
    assert lines[0] == f"{Z1}: queuing v6e-16 (spot, v6e-ubuntu-2404)"
    (attempt,) = capacity.CapacityStore().attempts()
    assert (attempt.zone, attempt.outcome, attempt.method, attempt.provisioning) == (
        Z1, "ready", "queued", "spot")
    assert attempt.ready_after_s >= attempt.active_after_s >= 0.3  # capacity came after 0.3 s
    assert emulator.queued_json(Z1, "grpo")["state"]["state"] == "ACTIVE"


async def test_a_request_cancelled_mid_wait_is_deleted_and_gone(emulator, make_provider):
    emulator.stockout(Z1)  # never any capacity: it waits
    provider = make_provider()
    lines: list[str] = []
    task = asyncio.create_task(provider.create(queued(), lines.append))
    await until(lambda: any("WAITING_FOR_RESOURCES" in line for line in lines), "the request to wait")
    task.cancel()
    with pytest.raises(CreateInterrupted) as interrupted:
        await task
    assert interrupted.value.requests == [f"{Z1}/grpo"]
    assert emulator.queued_json(Z1, "grpo") is not None  # nothing was deleted without asking

    await provider.cancel_requests(interrupted.value.requests, lines.append)

    assert emulator.queued_json(Z1, "grpo") is None
    assert "queued request grpo deleted, confirmed gone" in lines[-1]
    assert ("DELETE", f"/v2/projects/{PROJECT}/locations/{Z1}/queuedResources/grpo") in emulator.requests
    assert attempts() == [(Z1, "cancelled")]


async def test_race_over_three_zones_the_second_wins_and_the_others_are_deleted(emulator, make_provider):
    emulator.capacity_after(Z1, 30)
    emulator.capacity_after(Z2, 0.2)
    emulator.capacity_after(Z3, 30)
    lines: list[str] = []

    node = await make_provider().create(queued(zones=(Z1, Z2, Z3), race=True), lines.append)

    assert (node.zone, node.state) == (Z2, NodeState.READY)
    assert sorted(q["zone"] for q in emulator.queued_created) == sorted(ZONES)  # one request per zone
    assert emulator.queued_json(Z1, "grpo") is None and emulator.queued_json(Z3, "grpo") is None
    assert emulator.queued_json(Z2, "grpo")["state"]["state"] == "ACTIVE"
    for zone in (Z1, Z3):  # every zone's states are in the timeline, and the losers' deletion confirmed
        assert any(line.startswith(f"{zone}: WAITING_FOR_RESOURCES") for line in lines)
        assert f"{zone}: lost the race to {Z2}; deleting its request" in lines
        assert any(line.startswith(f"{zone}: queued request grpo deleted, confirmed gone") for line in lines)
    assert any(line.startswith(f"{Z2}: ACTIVE") for line in lines)
    # the losers went as soon as the winner was ACTIVE, before its node was READY
    ready = next(i for i, line in enumerate(lines) if line.startswith(f"{Z2}: node READY"))
    for zone in (Z1, Z3):
        assert lines.index(f"{zone}: lost the race to {Z2}; deleting its request") < ready
    assert sorted(attempts()) == sorted([(Z1, "lost race"), (Z2, "ready"), (Z3, "lost race")])


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"spot": {}}),
        ({"spot": False}, {}),
        ({"reservation": "rl-team"},
         {"reservationName": f"projects/{PROJECT}/locations/{Z1}/reservations/rl-team"}),
        ({"valid_for_s": 7200}, {"spot": {}, "queueingPolicy": {"validUntilDuration": "7200s"}}),
    ],
)
async def test_spot_reservation_and_valid_until_reach_the_api_as_the_client_sends_them(
    emulator, make_provider, fields, expected
):
    await make_provider().create(queued(labels={"team": "rl"}, **fields))
    (sent,) = emulator.queued_created
    body = sent["body"]
    assert (sent["zone"], sent["id"], sent["alpha"]) == (Z1, "grpo", False)
    assert {k: v for k, v in body.items() if k != "tpu"} == expected
    (spec,) = body["tpu"]["nodeSpec"]
    assert spec["parent"] == f"projects/{PROJECT}/locations/{Z1}" and spec["nodeId"] == "grpo"
    assert spec["node"]["acceleratorType"] == "v6e-16" and spec["node"]["runtimeVersion"] == "v6e-ubuntu-2404"
    assert spec["node"]["labels"] == {"created-by": "tpu-console", "tpu-console-user": "alice-smith",
                                      "team": "rl"}


async def test_best_effort_goes_through_v2alpha1(emulator, make_provider):
    await make_provider().create(queued(best_effort=True))
    (sent,) = emulator.queued_created
    assert sent["alpha"] is True and sent["body"]["bestEffort"] == {} and "spot" not in sent["body"]
    assert ("POST", f"/v2alpha1/projects/{PROJECT}/locations/{Z1}/queuedResources") in emulator.requests
    (request,) = (await make_provider().list_nodes()).requests
    assert request.state is QueueState.ACTIVE and request.has_node


async def test_a_suspended_request_is_listed_flagged_and_deleted(emulator, make_provider):
    emulator.add_queued(PROJECT, Z2, "parked", "v6e-8", state="WAITING_FOR_RESOURCES")
    emulator.suspend(Z2, "parked")
    provider = make_provider()

    listing = await provider.list_nodes()

    assert listing.nodes == []
    (request,) = listing.requests
    assert (request.name, request.zone, request.state, request.has_node) == ("parked", Z2,
                                                                              QueueState.SUSPENDED, False)
    assert request.state.holds_quota and request.reason == "suspended by the service"
    assert request.accelerator_type == "v6e-8" and request.provisioning == "spot"
    lines: list[str] = []
    await provider.delete("parked", lines.append)
    assert "holds quota until deleted" in lines[0]
    assert emulator.queued_json(Z2, "parked") is None
    assert (await provider.list_nodes()).requests == []


async def test_deleting_a_node_deletes_its_request_too(emulator, make_provider):
    provider = make_provider()
    await provider.create(queued())
    (node,) = (await provider.list_nodes()).nodes
    assert node.queued_request == "grpo"
    await provider.delete("grpo")
    listing = await provider.list_nodes()
    assert listing.nodes == [] and listing.requests == []
    assert ("DELETE", f"/v2/projects/{PROJECT}/locations/{Z1}/queuedResources/grpo") in emulator.requests


async def test_in_order_a_failed_request_moves_on_only_for_capacity(emulator, make_provider):
    emulator.stockout(Z1)  # waits until its valid-until passes, then FAILED for lack of capacity
    emulator.fail_queued(Z2, "Reservation projects/p/reservations/r not found in zone.", "NOT_FOUND")
    lines: list[str] = []

    node = await make_provider().create(queued(zones=(Z1, Z2, Z3), valid_for_s=1), lines.append)

    assert node.zone == Z3
    assert f"{Z1}: no capacity, trying next zone" in lines
    assert f"{Z2}: reservation not found, trying next zone" in lines
    assert any(line.startswith(f"{Z1}: FAILED (There is no more capacity") for line in lines)
    # FAILED requests hold quota: each was deleted before moving on.
    assert emulator.queued_json(Z1, "grpo") is None and emulator.queued_json(Z2, "grpo") is None
    assert attempts() == [(Z1, "no capacity"), (Z2, "reservation not found"), (Z3, "ready")]

    emulator.fail_queued(Z1, "Permission 'tpu.queuedResources.create' denied", "PERMISSION_DENIED")
    with pytest.raises(UserError, match=f"create other in {Z1}: permission denied"):
        await make_provider().create(queued("other", zones=(Z1, Z2)))
    assert [q["zone"] for q in emulator.queued_created][-1] == Z1  # Z2 was not tried


async def test_capacity_history_orders_zones_and_counts_preemptions(emulator, make_provider):
    emulator.fail_queued(Z1, "There is no more capacity in the zone.")
    provider = make_provider()
    await provider.create(queued("one", zones=(Z1, Z2)))
    emulator.preempt(Z2, "one", "Spot capacity was reclaimed.")
    await provider.list_nodes()  # the listing notes the preemption

    records = capacity.summarize(capacity.CapacityStore().attempts(), datetime.now(UTC))
    by_zone = {r.zone: r for r in records}
    assert (by_zone[Z1].attempts, by_zone[Z1].successes) == (1, 0)
    assert (by_zone[Z2].attempts, by_zone[Z2].successes, by_zone[Z2].preemptions) == (1, 1, 1)
    assert by_zone[Z2].median_wait_s > 0 and by_zone[Z2].preemptions_per_node_hour > 0
    # proven first, then configured zones never tried, then those that failed
    assert capacity.order_zones(ZONES, records, "v6e-16") == [Z2, Z3, Z1]


async def test_direct_and_types_without_queues_use_the_create_node_api(emulator, make_provider):
    lines: list[str] = []
    node = await make_provider().create(queued("v4-pod", accelerator_type="v4-16"), lines.append)
    assert node.queued_request is None and emulator.queued_created == []
    assert "v4-16 has no queued resources" in lines[0]
    assert attempts() == [(Z1, "ready")]
    with pytest.raises(UserError, match="--reservation work through a queued request: drop --direct"):
        await make_provider().create(CreateRequest("x", "v6e-8", zones=(Z1,), reservation="r"))


async def test_listing_shows_maintenance_and_symptoms(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "alpha", "v6e-8")
    emulator.set_maintenance(Z1, "alpha", "2026-11-25T03:00:00Z", "2026-11-25T05:00:00Z")
    emulator.set_symptom(Z1, "alpha", "HBM_OUT_OF_MEMORY", "worker ran out of HBM")
    (node,) = (await make_provider().list_nodes()).nodes
    assert node.maintenance is not None and node.maintenance.kind == "SCHEDULED"
    assert node.maintenance.starts_at == datetime(2026, 11, 25, 3, tzinfo=UTC)
    assert node.symptoms == ("HBM_OUT_OF_MEMORY (worker 0): worker ran out of HBM",)
    assert node.maintenance.overlaps(datetime(2026, 11, 25, 4, tzinfo=UTC), None)
    before = (datetime(2026, 11, 24, tzinfo=UTC), datetime(2026, 11, 25, tzinfo=UTC))
    assert not node.maintenance.overlaps(*before)


async def test_a_race_that_fails_everywhere_leaves_no_request_behind(emulator, make_provider):
    emulator.stockout(Z1)
    emulator.fail_next("getQueued", "PERMISSION_DENIED", "Permission 'tpu.queuedResources.get' denied",
                       zone=Z1)  # Z1 errors out while its request waits
    emulator.fail_queued(Z2, "There is no more capacity in the zone.")
    lines: list[str] = []
    with pytest.raises(UserError, match="in any zone: ") as caught:
        await make_provider().create(queued(zones=(Z1, Z2), race=True), lines.append)
    assert f"{Z2} no capacity" in str(caught.value)
    assert f"{Z1} permission denied: Permission 'tpu.queuedResources.get' denied" in str(caught.value)
    assert emulator.queued_json(Z1, "grpo") is None and emulator.queued_json(Z2, "grpo") is None
    assert f"{Z1}: queued request grpo deleted, confirmed gone" in " ".join(lines)
