"""A gcp multislice (one queued resource with a node count) through the provider and the CLI, unmodified,
against the TPU API emulator: created, listed, reached and deleted as one node; a slice preempted alone
flags the group and stops launches; bad input refused in one line with nothing left behind."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.fixtures_gcp import (  # noqa: F401 - fixtures
    PROJECT,
    ZONES,
    emulator,
    gcp_cli_emulator,
    gcp_home,
    make_provider,
)
from tpu_console import cli, ssh_identity
from tpu_console.domain import AcceleratorShape, CreateRequest, Node, NodeState, Worker
from tpu_console.errors import CreateInterrupted, UserError
from tpu_console.providers import capacity, create_options
from tpu_console.providers.gcp import multislice
from tpu_console.views.nodes import state_cell

Z1, Z2, Z3 = ZONES


def group(name: str = "grpo", zones=(Z1,), **fields) -> CreateRequest:
    return CreateRequest(name, fields.pop("accelerator_type", "v6e-16"), zones=zones, queued=True,
                         slices=fields.pop("slices", 2), **fields)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


async def until(condition, what: str, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def left_in(emulator, zone: str = Z1) -> tuple[list[str], list[str]]:
    """The nodes and queued requests the emulator still holds in `zone`."""
    with emulator._lock:
        return ([n for (_, z, n) in emulator._nodes if z == zone],
                [n for (_, z, n) in emulator._queued if z == zone])


async def test_two_slices_are_one_request_one_node_every_worker_and_one_delete(emulator, make_provider):
    provider = make_provider()
    lines: list[str] = []

    node = await provider.create(group(), lines.append)

    # one queued resource with a node count, no node id: the API names the nodes grpo-0, grpo-1
    (sent,) = emulator.queued_created
    (spec,) = sent["body"]["tpu"]["nodeSpec"]
    assert spec["multisliceParams"] == {"nodeCount": 2, "nodeIdPrefix": "grpo"} and "nodeId" not in spec
    assert sorted(left_in(emulator)[0]) == ["grpo-0", "grpo-1"]
    assert lines[0] == f"{Z1}: queuing 2x v6e-16 (spot, v6e-ubuntu-2404)"
    assert any(line.startswith(f"{Z1}: node READY (slices READY, READY) after") for line in lines)
    assert (node.name, node.slices, node.slice_states, node.state) == ("grpo", 2, ("READY", "READY"),
                                                                        NodeState.READY)
    assert (node.shape.workers, node.shape.chips, node.queued_request) == (8, 32, "grpo")

    listing = await provider.list_nodes()
    (listed,) = listing.nodes
    (request,) = listing.requests
    assert (listed.name, listed.slices, listed.shape.workers) == ("grpo", 2, 8)
    assert (request.name, request.slices, request.has_node) == ("grpo", 2, True)
    # every worker of every slice, numbered slice by slice, each slice's own hosts and host keys
    slice0, slice1 = (emulator.node_json(Z1, f"grpo-{i}") for i in range(2))
    hosts = [e["accessConfig"]["externalIp"] for e in slice0["networkEndpoints"] + slice1["networkEndpoints"]]
    assert len(set(hosts)) == 8
    targets = await provider.ssh_targets(listed)
    assert [(t.worker, t.host) for t in targets] == list(enumerate(hosts))
    expected_keys = emulator.host_key_lines(Z1, "grpo-0") + emulator.host_key_lines(Z1, "grpo-1")
    assert [list(t.host_keys) for t in targets] == expected_keys
    for name in ("grpo-0", "grpo-1"):  # the console's key reaches each slice's metadata
        assert ssh_identity.public_key_line() in emulator.node_json(Z1, name)["metadata"]["ssh-keys"]
    (attempt,) = capacity.CapacityStore().attempts()
    assert (attempt.accelerator_type, attempt.outcome, attempt.node) == ("2x v6e-16", "ready", "grpo")
    # a run's supervisor deletes the group through its request, which takes every slice with it
    target = provider.supervisor_delete_target(listed)
    assert target["queued_resource"] == f"projects/{PROJECT}/locations/{Z1}/queuedResources/grpo"

    await provider.delete("grpo", lines.append)

    assert left_in(emulator) == ([], [])
    assert ("DELETE", f"/v2/projects/{PROJECT}/locations/{Z1}/queuedResources/grpo") in emulator.requests
    assert not any(method == "DELETE" and "/nodes/" in path for method, path in emulator.requests)
    assert f"{Z1}: deleting grpo, 2 slices (grpo-0, grpo-1), with its queued request grpo" in lines


async def test_a_race_of_groups_keeps_the_first_active_zone_and_deletes_the_other(emulator, make_provider):
    emulator.capacity_after(Z1, 30)
    emulator.capacity_after(Z2, 0.1)

    node = await make_provider().create(group(zones=(Z1, Z2), race=True))

    assert (node.zone, node.slices, node.state) == (Z2, 2, NodeState.READY)
    assert left_in(emulator, Z1) == ([], [])
    assert sorted(left_in(emulator, Z2)[0]) == ["grpo-0", "grpo-1"]


def test_cli_create_ls_preempted_slice_and_delete(capsys, gcp_cli_emulator):
    emulator = gcp_cli_emulator
    status, out, err = run(capsys, "create", "grpo", "--type", "v6e-16", "--slices", "2", "--zones", Z2)
    assert status == 0, err
    assert out.strip() == f"created grpo: gcp v6e-16 x 2 slices (grpo-0, grpo-1), 8 workers in {Z2}, READY"

    status, out, _ = run(capsys, "ls")
    (row,) = [line for line in out.splitlines() if line.startswith("grpo ")]
    assert "2x v6e-16" in row and "READY 2/2" in row

    emulator.preempt(Z2, "grpo-1", "Spot capacity was reclaimed.")
    status, out, _ = run(capsys, "ls")
    (row,) = [line for line in out.splitlines() if line.startswith("grpo ")]
    assert "PREEMPTED (slice 1 of 2)" in row
    assert "slice 1 (grpo-1) PREEMPTED: its 2 slices run as one, so it cannot be launched on until it is " \
           "recreated" in out
    (record,) = json.loads(run(capsys, "ls", "--json")[1])["nodes"]
    assert (record["state"], record["slice_states"], record["workers"]) == ("PREEMPTED",
                                                                           ["READY", "PREEMPTED"], 8)

    # the capacity record: one attempt for the group, preempted once (both slices would count twice)
    (zone,) = json.loads(run(capsys, "capacity", "--type", "2xv6e-16", "--json")[1])["zones"]
    assert (zone["accelerator_type"], zone["attempts"], zone["successes"], zone["preemptions"]) == (
        "2x v6e-16", 1, 1, 1)
    assert json.loads(run(capsys, "capacity", "--type", "v6e-16", "--json")[1])["zones"] == []
    # --zones auto for a group goes by the groups' record: Z2 first; one slice's order is untouched
    assert create_options.auto_zones(ZONES, PROJECT, "v6e-16", 2) == (Z2, Z1, Z3)
    assert create_options.auto_zones(ZONES, PROJECT, "v6e-16") == (Z1, Z2, Z3)

    # the launch guard: one line, exit 2, nothing started
    status, _, err = run(capsys, "launch", "grpo", "--", sys.executable, "-c", "pass")
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert "grpo" in err and "slice 1 is PREEMPTED" in err and "recreate" in err

    status, _, err = run(capsys, "delete", "grpo", "--yes")
    assert status == 0, err
    assert left_in(emulator, Z2) == ([], [])


@pytest.mark.parametrize("argv, words", [
    (["--type", "v3-8", "--slices", "2"], "v3-8 has no Multislice"),
    (["--type", "v2-8", "--slices", "2"], "v2-8 has no Multislice"),
    (["--type", "v6e-16", "--slices", "0"], "--slices 0: use a whole number of slices"),
])
def test_bad_slices_are_refused_before_any_request(capsys, gcp_cli_emulator, argv, words):
    status, _, err = run(capsys, "create", "bad", *argv, "--provider", "gcp")
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err
    assert gcp_cli_emulator.queued_created == []


def test_a_request_whose_slice_failed_is_one_line_and_leaves_nothing(capsys, gcp_cli_emulator):
    emulator = gcp_cli_emulator
    emulator.fail_slice(Z1, 1, "Slice grpo-1 could not be provisioned: internal error.")

    status, out, err = run(capsys, "create", "grpo", "--type", "v6e-16", "--slices", "2", "--zones", Z1)

    assert status == 2 and out == ""
    (error,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert error == err.splitlines()[-1] and "Slice grpo-1 could not be provisioned" in error
    assert f"{Z1}: FAILED (Slice grpo-1 could not be provisioned: internal error.)" in err
    assert emulator.nodes_made == ["grpo-0"]  # slice 0 was made before slice 1 failed ...
    assert left_in(emulator) == ([], [])  # ... and went with the request


async def test_a_slice_preempted_while_the_group_is_created_deletes_the_whole_request(emulator,
                                                                                       make_provider):
    provider = make_provider()
    lines: list[str] = []

    def preempt_once_made(line: str) -> None:
        lines.append(line)
        if line.startswith(f"{Z1}: ACTIVE"):  # the slices exist, CREATING: one is reclaimed at once
            emulator.preempt(Z1, "grpo-1")

    with pytest.raises(UserError, match=r"slice 1 \(grpo-1\) is PREEMPTED while being created .*"
                                        "every slice were deleted, nothing is left"):
        await provider.create(group(), preempt_once_made)
    assert emulator.nodes_made == ["grpo-0", "grpo-1"] and left_in(emulator) == ([], [])
    assert [(a.accelerator_type, a.outcome) for a in capacity.CapacityStore().attempts()] == [
        ("2x v6e-16", "failed")]


async def test_a_waiting_group_cancelled_leaves_no_request(emulator, make_provider):
    emulator.stockout(Z1)  # never any capacity: it waits, as a closed terminal's create would
    provider = make_provider()
    lines: list[str] = []
    task = asyncio.create_task(provider.create(group(), lines.append))
    await until(lambda: any("WAITING_FOR_RESOURCES" in line for line in lines), "the request to wait")
    task.cancel()
    with pytest.raises(CreateInterrupted) as interrupted:
        await task
    assert interrupted.value.requests == [f"{Z1}/grpo"]  # one request for the whole group

    await provider.cancel_requests(interrupted.value.requests, lines.append)

    assert left_in(emulator) == ([], [])


async def test_a_best_effort_group_is_found_by_its_slices_naming_the_request(emulator, make_provider):
    # v2alpha1 calls the node count multi_node_params, which the v2 reads do not show
    provider = make_provider()
    await provider.create(group(best_effort=True))
    (sent,) = emulator.queued_created
    assert sent["alpha"] and sent["body"]["tpu"]["nodeSpec"][0]["multiNodeParams"]["nodeCount"] == 2

    found = await provider.get("grpo")

    assert (found.slices, found.shape.workers, found.slice_states) == (2, 8, ("READY", "READY"))
    await provider.delete("grpo")
    assert left_in(emulator) == ([], [])


def test_slices_sharing_a_request_group_without_its_listing_and_a_missing_slice_is_unknown():
    def one(name: str, state: NodeState, host: str) -> Node:
        return Node(name, "gcp", AcceleratorShape("v6e-16", 1, 4, 4), state, (Worker(0, host),), zone=Z1,
                    queued_request="grpo", spot=True)

    lone = Node("solo", "gcp", AcceleratorShape("v6e-8", 1, 8, 8), NodeState.READY, zone=Z1)
    listed = [one("grpo-1", NodeState.PREEMPTED, "b"), lone, one("grpo-0", NodeState.READY, "a")]

    grouped, solo = multislice.group_listed(listed, {})  # the request listing failed: they share a request

    assert solo is lone
    assert (grouped.name, grouped.state, grouped.slice_states) == ("grpo", NodeState.PREEMPTED,
                                                                   ("READY", "PREEMPTED"))
    assert [(w.index, w.host) for w in grouped.workers] == [(0, "a"), (1, "b")]
    assert state_cell(grouped) == "PREEMPTED (slice 1 of 2)"
    # the request names three slices, the listing shows two: the third is MISSING, the group UNKNOWN
    (partial, _) = multislice.group_listed(listed, {(Z1, "grpo"): ("grpo-0", "grpo-1", "grpo-2")})
    assert (partial.state, partial.slice_states, partial.shape.workers) == (
        NodeState.UNKNOWN, ("READY", "PREEMPTED", "MISSING"), 3)
