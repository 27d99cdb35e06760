"""Preemption recovery against the TPU API emulator: a preempted spot node is detected, deleted and created
again with the same name, type and spot setting, falling back to the next zone when its own has no
capacity; and the checkpoint folder must be one a new node can read."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import pytest

from tests.console.runs.test_local import CONFIG
from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home, make_provider  # noqa: F401 - fixtures
from tpu_console.errors import UserError
from tpu_console.experiments.recovery import _node_lost, recreate_node, require_durable_checkpoints
from tpu_console.model import NodeState

Z1, Z2, Z3 = ZONES


async def test_a_preempted_node_is_seen_and_recreated_in_the_next_zone_with_capacity(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "spotty", "v6e-16", spot=True)
    provider = make_provider()
    providers = {"gcp": provider}
    assert await _node_lost(providers, "spotty") is None
    node = await provider.get("spotty")

    emulator.preempt(Z1, "spotty", "Spot capacity was reclaimed.")
    emulator.stockout(Z1)  # its own zone has no capacity left: the fallback must move on
    assert await _node_lost(providers, "spotty") == "the node is PREEMPTED"
    lines: list[str] = []
    again = await recreate_node(providers, node, ZONES, lines.append)

    assert again.state is NodeState.READY and again.zone == Z2 and again.spot and again.name == "spotty"
    assert again.accelerator_type == "v6e-16"
    assert any("no capacity" in line for line in lines), lines
    assert await _node_lost(providers, "spotty") is None
    assert [n.zone for n in (await provider.list_nodes()).nodes] == [Z2]  # the preempted one was deleted


def test_recovery_needs_checkpoints_on_storage_that_outlives_the_node():
    with pytest.raises(UserError, match="--recover needs checkpoints"):
        require_durable_checkpoints(str(CONFIG), [], "gcp")
    with pytest.raises(UserError, match="use a gs:// bucket"):
        require_durable_checkpoints(
            str(CONFIG), ["checkpoint.dir=/root/ckpt", "checkpoint.every_steps=10"], "gcp"
        )
    require_durable_checkpoints(
        str(CONFIG), ["checkpoint.dir=gs://bucket/run", "checkpoint.every_steps=10"], "gcp"
    )
