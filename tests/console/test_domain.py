from datetime import UTC, datetime

import pytest

from tpu_console.domain import AcceleratorShape, CreateRequest, Node, NodeState, Worker, validate_node_name


def test_only_ready_is_usable():
    usable = [state for state in NodeState if state.is_usable]
    assert usable == [NodeState.READY]


@pytest.mark.parametrize("state", [NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.STOPPED])
def test_stopped_spot_nodes_still_hold_quota(state):
    assert state.holds_quota


@pytest.mark.parametrize("state", [NodeState.READY, NodeState.CREATING, NodeState.DELETING])
def test_live_or_transient_states_are_not_counted_as_leftover_quota(state):
    assert not state.holds_quota


def test_node_state_mirrors_the_tpu_api_names():
    # Values are the API's enum names, so a gcp node's state maps with NodeState(api_name).
    assert NodeState("READY") is NodeState.READY
    assert str(NodeState.PREEMPTED) == "PREEMPTED"


def test_shape_total_devices_and_chips_are_separate():
    v4 = AcceleratorShape("v4-16", workers=2, devices_per_worker=4, chips=8)
    assert v4.total_devices == 8
    v6e = AcceleratorShape("v6e-16", workers=4, devices_per_worker=4, chips=16)
    assert v6e.total_devices == 16


def test_node_exposes_its_accelerator_type_and_defaults():
    shape = AcceleratorShape("local-2x4", workers=2, devices_per_worker=4, chips=8)
    node = Node(
        name="pod-a",
        provider="local",
        shape=shape,
        state=NodeState.READY,
        workers=(Worker(0, "127.0.0.1", 2200), Worker(1, "127.0.0.1", 2201)),
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
    )
    assert node.accelerator_type == "local-2x4"
    assert node.workers[1].port == 2201
    assert node.workers[0].internal_ip is None
    assert node.labels == {} and not node.spot and node.zone is None


def test_nodes_do_not_share_label_dicts():
    shape = AcceleratorShape("local-1x1", 1, 1, 1)
    a = Node("a", "local", shape, NodeState.READY)
    b = Node("b", "local", shape, NodeState.READY)
    a.labels["team"] = "x"
    assert b.labels == {}


def test_model_objects_are_immutable():
    worker = Worker(0, "h")
    with pytest.raises(AttributeError):
        worker.host = "other"  # type: ignore[misc]


def test_create_request_defaults_to_spot_with_no_zone_preference():
    request = CreateRequest(name="n", accelerator_type="v6e-8")
    assert request.spot is True
    assert request.zones == ()
    assert request.runtime_version is None


@pytest.mark.parametrize("name", ["a", "pod-1", "v6e-16-run", "a" * 63])
def test_valid_node_names(name):
    assert validate_node_name(name) is None


@pytest.mark.parametrize("name", ["", "1pod", "Pod", "pod-", "pod_1", "pod.1", "a" * 64, "-pod"])
def test_invalid_node_names_explain_the_rule(name):
    message = validate_node_name(name)
    assert message is not None
    assert repr(name) in message and "lowercase letters, digits and hyphens" in message
