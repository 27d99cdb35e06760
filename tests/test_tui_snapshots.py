"""Snapshot tests of the first screen. Fixed nodes, clock and terminal size keep them deterministic.

Update after an intended UI change with `pytest tests/test_tui_snapshots.py --snapshot-update`, and look
at the report before committing the new SVGs.
"""

from __future__ import annotations

from datetime import timedelta

from tests.fixtures_cli import NOW, FakeProvider, make_node
from tpu_console.model import NodeState
from tpu_console.tui.app import TpuConsoleApp

SIZE = (120, 24)


class LocalFake(FakeProvider):
    name = "local"


def fleet_app(problems: list[str] | None = None) -> TpuConsoleApp:
    gcp = FakeProvider(
        [
            make_node("grpo-v6e-16", "gcp", age=timedelta(days=1, hours=4)),
            make_node(
                "spare-v4",
                "gcp",
                accelerator_type="v4-16",
                workers=2,
                state=NodeState.PREEMPTED,
                zone="us-central2-b",
            ),
        ],
        problems=problems,
    )
    local = LocalFake(
        [
            make_node(
                "rehearsal",
                "local",
                accelerator_type="local-2x4",
                workers=2,
                zone="local",
                spot=False,
                age=timedelta(minutes=7),
            )
        ]
    )
    return TpuConsoleApp({"local": local, "gcp": gcp}, refresh_every=3600, clock=lambda: NOW)


async def until_listed(pilot) -> None:
    for _ in range(200):
        if pilot.app.screen.refreshes:
            break
        await pilot.pause(0.01)
    await pilot.pause()


def test_nodes_table(snap_compare):
    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=until_listed)


def test_help_dialog(snap_compare):
    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=until_listed, press=["question_mark"])


def test_provider_problem_and_empty_listing(snap_compare):
    broken = FakeProvider(problems=["zone us-east1-d: 503 service unavailable"])
    app = TpuConsoleApp({"gcp": broken}, refresh_every=3600, clock=lambda: NOW)
    assert snap_compare(app, terminal_size=SIZE, run_before=until_listed)
