"""Pure logic of the gcp provider: accelerator shapes, error classification, ssh-keys merging, host-key
pinning, and the price table."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from tests.fixtures_gcp import gcp_home  # noqa: F401 - fixture
from tests.tpu_api_emulator import fake_host_key
from tpu_console.domain import AcceleratorShape, Node, NodeState
from tpu_console.errors import UserError
from tpu_console.pricing import cost_since_creation, load_table, price_per_hour
from tpu_console.providers.gcp import accelerators
from tpu_console.providers.gcp.errors import FailureKind, classify, classify_operation_error
from tpu_console.providers.gcp.ssh_access import check_and_pin, fingerprint, merge_ssh_key


@pytest.mark.parametrize(
    ("accelerator_type", "workers", "devices_per_worker", "chips"),
    [
        ("v6e-1", 1, 1, 1),
        ("v6e-8", 1, 8, 8),
        ("v6e-16", 4, 4, 16),
        ("v6e-256", 64, 4, 256),
        ("v4-8", 1, 4, 4),
        ("v4-16", 2, 4, 8),
        ("v4-32", 4, 4, 16),
        ("v5p-8", 1, 4, 4),
        ("v5p-128", 16, 4, 64),
        ("v5litepod-8", 1, 8, 8),
        ("v5litepod-16", 4, 4, 16),
        ("v5e-16", 4, 4, 16),
        ("v2-8", 1, 8, 4),
        ("v3-32", 4, 8, 16),
    ],
)
def test_shapes_follow_the_documented_table(accelerator_type, workers, devices_per_worker, chips):
    shape = accelerators.shape_for(accelerator_type)
    assert (shape.workers, shape.devices_per_worker, shape.chips) == (workers, devices_per_worker, chips)


def test_v5e_is_spelled_as_the_api_wants_it():
    assert accelerators.canonical_type("v5e-16") == "v5litepod-16"
    assert accelerators.shape_for("v5e-16").accelerator_type == "v5litepod-16"


def test_default_runtime_versions():
    assert accelerators.default_runtime_version("v6e-16") == "v6e-ubuntu-2404"
    assert accelerators.default_runtime_version("v4-16") == "tpu-ubuntu2204-base"
    assert accelerators.default_runtime_version("v5litepod-8") == "v2-alpha-tpuv5-lite"
    assert accelerators.default_runtime_version("v5p-8") == "v2-alpha-tpuv5"


@pytest.mark.parametrize("bad", ["v9-8", "tpu", "v6e", "v6e-x", "local-4x4", "v6e-0"])
def test_unknown_types_name_the_known_families(bad):
    with pytest.raises(UserError, match="v6e") as caught:
        accelerators.shape_for(bad)
    assert "\n" not in str(caught.value)


def test_listed_node_trusts_its_endpoint_count_and_never_raises():
    assert accelerators.shape_of_listed_node("v6e-16", 4) == AcceleratorShape("v6e-16", 4, 4, 16)
    assert accelerators.shape_of_listed_node("v6e-16", 0) == AcceleratorShape("v6e-16", 4, 4, 16)
    assert accelerators.shape_of_listed_node("v7x-64", 8) == AcceleratorShape("v7x-64", 8, 0, 0)


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        ("RESOURCE_EXHAUSTED", 'There is no more capacity in the zone "us-east1-d"', FailureKind.CAPACITY),
        ("UNAVAILABLE", "Insufficient capacity for v6e-16 in zone europe-west4-a", FailureKind.CAPACITY),
        ("RESOURCE_EXHAUSTED", "Quota limit 'TPUV6EPreemptiblePodPerProjectPerZone' has been exceeded",
         FailureKind.QUOTA),
        ("NOT_FOUND", "Reservation projects/p/reservations/r not found", FailureKind.RESERVATION),
        ("PERMISSION_DENIED", "Permission 'tpu.nodes.create' denied", FailureKind.PERMISSION),
        ("INVALID_ARGUMENT", "Accelerator type 'v6e-3' not found", FailureKind.INVALID),
        ("ALREADY_EXISTS", "Resource already exists", FailureKind.EXISTS),
        ("ABORTED", "The node is being modified", FailureKind.CONFLICT),
        ("NOT_FOUND", "Resource 'projects/p/locations/z/nodes/n' was not found", FailureKind.NOT_FOUND),
    ],
)
def test_classification(status, message, kind):
    assert classify(status, message).kind is kind


def test_only_capacity_and_reservation_move_to_the_next_zone():
    movers = {kind for kind in FailureKind if kind.tries_next_zone}
    assert movers == {FailureKind.CAPACITY, FailureKind.RESERVATION}


def test_operation_errors_are_classified_by_their_numeric_code():
    assert classify_operation_error(8, "no more capacity in the zone").kind is FailureKind.CAPACITY
    assert classify_operation_error(7, "denied").kind is FailureKind.PERMISSION


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIConsole tpu-console@me"


def test_merge_appends_and_keeps_every_other_line():
    existing = "alice:ssh-rsa AAAAB3Alice alice\nbob:ssh-ed25519 AAAAC3Bob bob"
    merged = merge_ssh_key(existing, "root", KEY)
    assert merged == existing + "\nroot:" + KEY


def test_merge_is_a_no_op_when_the_user_has_the_key_even_with_another_comment():
    existing = "root:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIConsole other-comment"
    assert merge_ssh_key(existing, "root", KEY) is None
    assert merge_ssh_key(existing, "ubuntu", KEY) == existing + "\nubuntu:" + KEY
    assert merge_ssh_key("", "root", KEY) == "root:" + KEY


def test_pins_refuse_a_changed_key_and_accept_new_key_types(gcp_home):
    first, second, rsa = fake_host_key(b"a" * 32), fake_host_key(b"b" * 32), "ssh-rsa AAAAB3NzaC1yc2E="
    path = "projects/p/locations/z/nodes/n"
    assert check_and_pin(path, "1", [[first]]) == [(first,)]
    assert check_and_pin(path, "1", [[first, rsa]]) == [tuple(sorted([first, rsa]))]
    with pytest.raises(UserError, match=f"worker 0 .* changed: pinned {re.escape(fingerprint(first))}"):
        check_and_pin(path, "1", [[second]])
    assert check_and_pin(path, "2", [[second]]) == [(second,)]  # a new node id: a new node


def test_fingerprint_matches_openssh_format():
    line = fake_host_key(bytes(32))
    assert fingerprint(line).startswith("SHA256:") and "=" not in fingerprint(line)


def gcp_node(accelerator_type: str, chips: int, *, spot: bool, age_hours: float | None) -> Node:
    created = datetime(2026, 11, 1, tzinfo=UTC)
    return Node(
        name="n", provider="gcp", shape=AcceleratorShape(accelerator_type, 1, chips, chips),
        state=NodeState.READY, spot=spot, created_at=created if age_hours is not None else None,
    )


def test_price_per_hour_scales_with_chips_and_knows_spot_from_on_demand():
    table = load_table()
    on_demand, spot = table.per_chip_hour["v6e"]
    estimate = price_per_hour(gcp_node("v6e-16", 16, spot=True, age_hours=1))
    assert estimate.on_demand_per_hour == pytest.approx(16 * on_demand)
    assert estimate.per_hour == pytest.approx(16 * spot)
    assert estimate.as_of == table.as_of == "2026-11"
    assert "as of 2026-11" in estimate.describe()
    assert price_per_hour(gcp_node("v5litepod-8", 8, spot=False, age_hours=1)).per_hour == pytest.approx(
        8 * table.per_chip_hour["v5e"][0])


def test_every_priced_family_has_spot_cheaper_than_on_demand():
    table = load_table()
    assert set(table.per_chip_hour) == {"v4", "v5e", "v5p", "v6e"}
    assert all(0 < spot < on_demand for on_demand, spot in table.per_chip_hour.values())


def test_cost_since_creation():
    node = gcp_node("v4-16", 8, spot=False, age_hours=0)
    now = node.created_at + timedelta(hours=2, minutes=30)
    assert cost_since_creation(node, now) == pytest.approx(2.5 * 8 * load_table().per_chip_hour["v4"][0])
    assert cost_since_creation(gcp_node("v4-16", 8, spot=False, age_hours=None), now) is None
    local = Node(
        name="l", provider="local", shape=AcceleratorShape("local-2x4", 2, 4, 8), state=NodeState.READY
    )
    assert price_per_hour(local) is None
