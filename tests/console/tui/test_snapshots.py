"""Snapshot tests of the first screen. Fixed nodes, clock and terminal size keep them deterministic.

Update after an intended UI change with `pytest tests/console/tui/test_snapshots.py --snapshot-update`,
and look at the report before committing the new SVGs.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace

import pytest

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.domain import NodeState
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.options import ConsoleOptions
from tpu_console.tui.widgets.node_table import NodeTable

SIZE = (100, 30)  # the smallest terminal every panel must be legible in


pytestmark = pytest.mark.usefixtures("console_home", "planner")


@pytest.fixture(autouse=True)
def no_probes(monkeypatch) -> None:
    """Runs keep their recorded state: the fake nodes have no workers to probe."""
    from tpu_console.observe import lookup

    async def observe(providers, records, store, *args, **kwargs):
        return [lookup.RunView(record=r, state=r.state, workers=[], live=False) for r in records]

    monkeypatch.setattr(lookup, "observe", observe)


def add_run(run_id: str, node: str, state: str, started_h: float, ended_h: float | None = None,
            summary: dict | None = None, failure: str | None = None) -> None:
    store = RunStore()
    store.add(
        RunRecord(
            run_id=run_id,
            node=node,
            provider="gcp",
            accelerator_type="v6e-16",
            workers=[0, 1, 2, 3],
            config_path="/c/qwen25_3b_v6e16_bench.yaml",
            config_digest="d",
            overrides=[],
            python="python3",
            started_at=NOW - timedelta(hours=started_h),
            state=state,
            failure=failure,
            finished_at=None if ended_h is None else NOW - timedelta(hours=ended_h),
            price_per_hour=21.6,
        )
    )
    if summary:
        store.set_summary(run_id, summary)


class LocalFake(FakeProvider):
    name = "local"


def fleet_app(problems: list[str] | None = None) -> TpuConsoleApp:
    gcp = FakeProvider(
        [
            replace(make_node("grpo-v6e-16", "gcp", age=timedelta(days=1, hours=4)), health="HEALTHY"),
            make_node(
                "spare-v4",
                "gcp",
                accelerator_type="v4-16",
                workers=2,
                state=NodeState.PREEMPTED,
                zone="us-central2-b",
            ),
            replace(
                make_node(
                    "bench-v6e-8",
                    "gcp",
                    accelerator_type="v6e-8",
                    workers=1,
                    devices=8,
                    spot=False,
                    age=timedelta(hours=2),
                ),
                health="UNHEALTHY_MAINTENANCE",
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
                zone=None,
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
    # The table sizes its columns when it next renders its rows: on a loaded machine a screenshot (or a
    # modal on top) could come first and catch the columns at the width of their headers.
    table = pilot.app.screen.query(NodeTable)
    for _ in range(200):
        if not table or table.first().row_count == 0 or table.first().virtual_size.width > 60:
            break
        await pilot.pause(0.01)
    await pilot.pause()


def test_nodes_table(snap_compare):
    add_run("20250314-113000-abcd", "grpo-v6e-16", "running", started_h=0.5)
    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=until_listed)


def test_filtered_nodes_table(snap_compare):
    async def filtered(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("slash", *"gcp")
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=filtered)


def test_stop_confirmation(snap_compare):
    add_run("20250314-113000-abcd", "grpo-v6e-16", "running", started_h=0.5)
    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=until_listed, press=["down", "x"])


def test_operations_panel_while_two_operations_run(snap_compare, monkeypatch):
    import asyncio

    from tpu_console.provision import bootstrap, code_sync

    async def slow_bootstrap(providers, node, *, progress, on_worker, **kw):
        progress(f"{node}: bootstrapping 4 worker(s)")
        for worker in range(4):
            on_worker(worker, "installing the trainer's dependencies with pip")
        await asyncio.Event().wait()  # still going when the snapshot is taken

    async def sync(providers, node, *, progress, on_worker, **kw):
        progress(f"{node}: tpu_console-0.1.0-py3-none-any.whl at 9f8506eb0fb7")
        on_worker(0, "code installed")
        on_worker(1, "code installed")
        report = SimpleNamespace(versions_label=lambda: "python=3.11.7 jax=0.10.2")
        return SimpleNamespace(
            workers=[SimpleNamespace(worker=w, ok=True, error=None, report=report) for w in (0, 1)]
        )

    monkeypatch.setattr(bootstrap, "bootstrap_node", slow_bootstrap)
    monkeypatch.setattr(code_sync, "sync_node", sync)

    async def two_operations(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("b", "down", "down", "down", "s", "enter")
        for _ in range(200):
            if pilot.app.screen.running == ["bootstrap grpo-v6e-16"]:
                break
            await pilot.pause(0.01)
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=two_operations)


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


def test_gcp_create_form_refusing_a_bad_wait_for_at_100x30(snap_compare):
    app = fleet_app()
    app.options = ConsoleOptions(default_provider="gcp", zones=["europe-west4-a", "us-east5-b"])

    async def fill(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("c", "tab", "tab", "tab", "tab", "tab", *"soon", "enter")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(100, 30), run_before=fill)


def test_launch_form_refusing_a_batch_that_does_not_divide(snap_compare):
    async def fill(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("down", "l", "tab", "tab", "tab", *"rollout.batch_size=3", "enter")
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=(100, 40), run_before=fill)


def test_sync_form_refusing_a_git_url_without_its_branch(snap_compare):
    async def fill(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("down", "s", "tab", *"https://example.com/me/tpu-console.git", "enter")
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=fill)


def test_delete_dialog(snap_compare):
    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=until_listed, press=["down", "d"])


def test_runs_screen(snap_compare):
    add_run("20250314-000000-abc0", "grpo-v6e-16", "succeeded", started_h=5, ended_h=4)
    add_run(
        "20250314-010000-abc1",
        "grpo-v6e-16",
        "failed",
        started_h=3,
        ended_h=2,
        failure="worker 2 exited 1: RESOURCE_EXHAUSTED",
    )
    add_run("20250314-020000-abc2", "grpo-v6e-16", "running", started_h=1)

    async def open_runs(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("R")
        await until_runs_listed(pilot)
        await pilot.press("space", "down")  # one marked; the cursor on the failed run shows why it failed
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=open_runs)


async def until_runs_listed(pilot) -> None:
    for _ in range(200):
        if getattr(pilot.app.screen, "listings", 0):
            break
        await pilot.pause(0.01)
    await pilot.pause()


def test_compare_dialog(snap_compare):
    # The seeds' comparison: legacy vs maxtext rollout sharding on a v6e-16 (numbers of that shape).
    add_run(
        "20250314-000000-abc0",
        "grpo-v6e-16",
        "succeeded",
        started_h=5,
        ended_h=4,
        summary={
            "time/train/step_avg_last10_s": 31.2,
            "throughput/train/valid_tokens_per_s": 5210.0,
            "memory/train/bytes_in_use_max_gib": 21.4,
            "memory/train/peak_bytes_in_use_max_gib": 27.9,
            "train-reward/total/mean": 0.41,
        },
    )
    add_run(
        "20250314-010000-abc1",
        "grpo-v6e-16",
        "succeeded",
        started_h=3,
        ended_h=2.2,
        summary={
            "time/train/step_avg_last10_s": 24.6,
            "throughput/train/valid_tokens_per_s": 6630.0,
            "memory/train/bytes_in_use_max_gib": 18.9,
            "memory/train/peak_bytes_in_use_max_gib": 30.1,
            "train-reward/total/mean": 0.43,
        },
    )

    async def compare(pilot) -> None:
        await until_listed(pilot)
        await pilot.press("R")
        await until_runs_listed(pilot)
        await pilot.press("down", "space", "up", "space", "c")
        await pilot.pause()

    assert snap_compare(fleet_app(), terminal_size=SIZE, run_before=compare)
