"""The nodes screen says what each node last ran: the command, the job file or the trainer config, after the
run's state, where the screen has room for it (a table wider than the screen would hide the state)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.widgets.node_table import NodeTable
from tpu_console.views.nodes import what_ran

pytestmark = pytest.mark.usefixtures("console_home")


def record(run_id: str, node: str, job: dict | None, config_path: str = "/c/tiny_local.yaml") -> RunRecord:
    return RunRecord(run_id=run_id, node=node, provider="fake", accelerator_type="v6e-16", workers=[0],
                     config_path=config_path, config_digest="d", overrides=[], python="python3",
                     started_at=NOW - timedelta(minutes=30), state="running", job=job)


def test_what_ran_names_the_job_file_the_command_or_the_config():
    command = {"kind": "command", "command": ["python", "-m", "nash_mhc.train", "--mesh-data", "2"]}
    assert what_ran(record("r", "n", command)) == "python -m nash_mhc.train --me…"
    assert what_ran(record("r", "n", {**command, "job_file": "/home/me/grpo.toml"})) == "grpo.toml"
    assert what_ran(record("r", "n", None)) == "tiny_local.yaml"
    assert what_ran(record("r", "n", {"kind": "trainer", "command": []})) == "tiny_local.yaml"


@pytest.mark.parametrize(("width", "shown"), [(160, True), (70, False)])
async def test_the_run_column_adds_what_ran_where_there_is_room(width, shown):
    store = RunStore()
    store.add(record("20250314-113000-abcd", "pod-a", {"kind": "command", "command": ["python", "train.py"]}))
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW,
                        store=store)
    async with app.run_test(size=(width, 30)) as pilot:
        for _ in range(300):
            if app.screen.refreshes:
                break
            await pilot.pause(0.01)
        table = app.screen.query_one(NodeTable)
        cell = str(table.get_row_at(0)[-1])
        assert cell.startswith("running 30m")
        assert ("python train.py" in cell) is shown
