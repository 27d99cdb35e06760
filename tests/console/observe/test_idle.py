"""Idle nodes: the judgement from nodes and run history, and `tpu-console idle` on a local pod."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tests.console.launch.test_local import run
from tests.fixtures_cli import NOW, console_home, make_node  # noqa: F401 - fixture
from tpu_console.domain import NodeState
from tpu_console.history.store import RunRecord
from tpu_console.locations import home
from tpu_console.observe.idle_nodes import find_idle


def record(node: str, started: timedelta, finished: timedelta | None, provider: str = "gcp") -> RunRecord:
    return RunRecord(run_id="20250101-000000-abcd", node=node, provider=provider, accelerator_type="v6e-16",
                     workers=[0], config_path="c.yaml", config_digest="d", overrides=[], python="python3",
                     started_at=NOW - started, finished_at=None if finished is None else NOW - finished)


def test_ready_nodes_without_a_live_run_for_longer_than_the_limit_are_idle():
    hour = timedelta(hours=1)
    nodes = [make_node("fresh", "gcp", age=timedelta(minutes=10)),
             make_node("forgotten", "gcp", age=3 * hour),
             make_node("busy", "gcp", age=3 * hour),
             make_node("ended-late", "gcp", age=3 * hour),
             make_node("preempted", "gcp", age=3 * hour, state=NodeState.PREEMPTED),
             make_node("reborn", "gcp", age=2 * hour)]
    runs = [record("busy", 2 * hour, None), record("ended-late", 2 * hour, timedelta(minutes=20)),
            record("forgotten", 150 * timedelta(minutes=1), 2 * hour),
            record("reborn", 5 * hour, 4 * hour)]  # a run of an earlier node of that name
    idle = {i.node.name: i for i in find_idle(nodes, runs, NOW, hour)}
    assert set(idle) == {"forgotten", "reborn"}
    assert idle["forgotten"].idle_for == 2 * hour and idle["reborn"].idle_for == 2 * hour
    # a v6e-16 spot node at the shipped price: cost while idle is 2 hours of its hourly price
    forgotten = idle["forgotten"]
    assert forgotten.cost_while_idle == pytest.approx(forgotten.cost_so_far * 2 / 3)
    assert "forgotten idle for 2h00m, ~$" in forgotten.describe()


@pytest.mark.usefixtures("console_home")
def test_idle_lists_and_deletes_a_local_pod_left_without_runs(capsys):
    assert run(capsys, "create", "old", "--type", "local-1x1")[0] == 0
    assert run(capsys, "create", "new", "--type", "local-1x1")[0] == 0
    meta_file = home() / "local" / "old" / "node.json"
    meta = json.loads(meta_file.read_text())
    meta["created_at"] = "2020-01-01T00:00:00+00:00"
    meta_file.write_text(json.dumps(meta))

    status, out, _ = run(capsys, "idle", "--after", "60", "--json")
    assert status == 0 and [i["node"] for i in json.loads(out)["idle"]] == ["old"]
    status, _, err = run(capsys, "idle", "--auto-delete-idle", "--json")
    assert status == 2 and "without --yes" in err
    status, out, err = run(capsys, "idle", "--auto-delete-idle", "--yes")
    assert status == 0 and "deleted old idle for" in err
    status, out, _ = run(capsys, "ls", "--json")
    assert [n["name"] for n in json.loads(out)["nodes"]] == ["new"]
