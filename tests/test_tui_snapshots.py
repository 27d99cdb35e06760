"""Snapshot tests of the first screen. Fixed nodes, clock and terminal size keep them deterministic.

Update after an intended UI change with `pytest tests/test_tui_snapshots.py --snapshot-update`, and look
at the report before committing the new SVGs.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.model import NodeState
from tpu_console.tui.app import TpuConsoleApp

SIZE = (100, 30)  # the smallest terminal every panel must be legible in


pytestmark = pytest.mark.usefixtures("console_home")


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


def test_create_form_with_a_bad_name(snap_compare):
    async def fill(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("c", *"Bad_Name", "enter")
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=(100, 40), run_before=fill)


def test_launch_form_refusing_a_batch_that_does_not_divide(snap_compare):
    async def fill(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("l", "tab", "tab", *"rollout.batch_size=3", "enter")
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=(100, 40), run_before=fill)


def test_delete_dialog(snap_compare):
    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=until_listed, press=["d"])


def test_runs_screen(snap_compare):
    from datetime import timedelta

    from tpu_console.runs.store import RunRecord, RunStore

    store = RunStore()
    for i, (state, hours) in enumerate((("succeeded", 5), ("failed", 3), ("running", 1))):
        store.add(RunRecord(run_id=f"20250314-0{i}0000-abc{i}", node="grpo-v6e-16", provider="gcp",
                            accelerator_type="v6e-16", workers=[0, 1, 2, 3], config_path="/c/qwen25_3b_v6e16_bench.yaml",
                            config_digest="d", overrides=[], python="python3", started_at=NOW - timedelta(hours=hours),
                            state=state, failure="worker 2 exited 1: RESOURCE_EXHAUSTED" if state == "failed" else None,
                            finished_at=None if state == "running" else NOW - timedelta(hours=hours - 1),
                            price_per_hour=21.6))

    async def open_runs(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("R")
        for _ in range(200):
            if getattr(pilot.app.screen, "listings", 0):
                break
            await pilot.pause(0.01)
        await pilot.press("space")
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=open_runs)
