"""Pilot tests of the nodes screen's keys and modals: create, delete, bootstrap, sync, launch, stop, open,
filter, and the runs screen with its comparison. The operations themselves are the layers below's (tested
there); here the fakes record what the app asked for, and bad input must stay in the form."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from textual.widgets import Checkbox, DataTable, Input, Static

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.domain import NodeState
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.compare import CompareModal
from tpu_console.tui.modals.confirm import ConfirmModal
from tpu_console.tui.modals.create_node import CreateNodeModal
from tpu_console.tui.modals.delete_node import DeleteNodeModal
from tpu_console.tui.modals.launch import LaunchModal
from tpu_console.tui.modals.sync import SyncModal
from tpu_console.tui.options import ConsoleOptions
from tpu_console.tui.screens.nodes_screen import NodesScreen
from tpu_console.tui.screens.runs_screen import RunsScreen
from tpu_console.tui.widgets.node_table import NodeTable
from tpu_console.tui.widgets.operations_log import OperationsLog

pytestmark = pytest.mark.usefixtures("console_home", "planner")


@pytest.fixture(autouse=True)
def probes(monkeypatch) -> list[list[str]]:
    """The nodes screen probes the latest unfinished run of each READY node; here the probe learns
    nothing (the fake nodes have no workers), and the run ids probed are recorded."""
    from tpu_console.observe import lookup

    seen: list[list[str]] = []

    async def observe(providers, records, store, *args, **kwargs):
        seen.append([r.run_id for r in records])
        return [
            lookup.RunView(record=r, state=r.state, workers=[], live=False, problem="no workers")
            for r in records
        ]

    monkeypatch.setattr(lookup, "observe", observe)
    return seen


TINY = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"


def app_with(provider: FakeProvider) -> TpuConsoleApp:
    options = ConsoleOptions(default_provider="fake")
    return TpuConsoleApp({"fake": provider}, refresh_every=3600, clock=lambda: NOW, options=options)


async def submit(pilot, modal, field: str = "#name") -> None:
    """Enter in one of the form's fields: what a person does (and what the form's submit handles)."""
    modal.query_one(field, Input).focus()
    await pilot.press("enter")
    await pilot.pause()


async def until(pilot, condition, what: str) -> None:
    for _ in range(300):
        if condition():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def started(pilot, app) -> NodesScreen:
    screen = app.screen
    await until(pilot, lambda: screen.refreshes >= 1, "the first listing")
    return screen


def ops_text(screen: NodesScreen) -> str:
    return "\n".join(screen.query_one("#ops", OperationsLog).lines_written)


def add_run(node: str, run_id: str, finished: bool, state: str, summary: dict | None = None, **extra) -> None:
    store = RunStore()
    store.add(
        RunRecord(
            run_id=run_id,
            node=node,
            provider="fake",
            accelerator_type="v6e-16",
            workers=[0, 1],
            config_path=str(TINY),
            config_digest="d",
            overrides=[],
            python="python3",
            started_at=NOW - timedelta(minutes=30),
            state=state,
            finished_at=NOW - timedelta(minutes=5) if finished else None,
            **extra,
        )
    )
    if summary:
        store.set_summary(run_id, summary)


async def test_c_creates_after_refusing_bad_names_and_types_in_the_form():
    provider = FakeProvider([])
    app = app_with(provider)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await started(pilot, app)
        await pilot.press("c")
        assert isinstance(app.screen, CreateNodeModal)
        modal = app.screen
        modal.query_one("#name", Input).value = "Bad_Name"
        modal.query_one("#type", Input).value = "v6e-16"
        await submit(pilot, modal)
        assert "invalid node name 'Bad_Name'" in str(modal.query_one("#error", Static).render())
        modal.query_one("#name", Input).value = "grpo"
        modal.query_one("#type", Input).value = ""
        await submit(pilot, modal)
        assert "give an accelerator type" in str(modal.query_one("#error", Static).render())
        assert isinstance(app.screen, CreateNodeModal) and provider.created == []
        modal.query_one("#type", Input).value = "v6e-8"
        await pilot.click("#create")  # the button works too
        await until(pilot, lambda: "grpo is READY" in ops_text(screen), "the create to finish")
        assert [r.name for r in provider.created] == ["grpo"] and provider.created[0].spot
        assert "create grpo: creating grpo" in ops_text(screen)  # the provider's progress, as it came
        await until(pilot, lambda: screen.query_one("#nodes", DataTable).row_count == 1, "the new node")


async def test_esc_leaves_the_create_form_without_creating():
    provider = FakeProvider([])
    app = app_with(provider)
    async with app.run_test() as pilot:
        await started(pilot, app)
        await pilot.press("c", "escape")
        assert isinstance(app.screen, NodesScreen) and provider.created == []


async def test_d_deletes_only_when_the_name_is_typed_back():
    provider = FakeProvider([make_node("pod-a")])
    app = app_with(provider)
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        await pilot.press("d")
        assert isinstance(app.screen, DeleteNodeModal)
        await pilot.press(*"pod-b", "enter")
        assert "does not match 'pod-a'" in str(app.screen.query_one("#error", Static).render())
        assert provider.deleted == []
        app.screen.query_one("#typed", Input).value = "pod-a"
        await pilot.press("enter")
        await until(pilot, lambda: provider.deleted == ["pod-a"], "the delete")
        await until(pilot, lambda: "pod-a deleted" in ops_text(screen), "its outcome in the log")


async def test_b_and_s_run_bootstrap_and_sync_with_per_worker_progress(monkeypatch):
    from tpu_console.provision import bootstrap, code_sync

    calls = []

    def fake(kind):
        async def run(providers, node, *, progress, on_worker, **kw):
            calls.append((kind, node))
            progress(f"{node}: {kind} on 2 worker(s)")
            on_worker(1, "installing the trainer's dependencies")
            report = SimpleNamespace(versions_label=lambda: "python=3.11.7 jax=0.10.2")
            return SimpleNamespace(
                workers=[SimpleNamespace(worker=w, ok=True, error=None, report=report) for w in (0, 1)]
            )

        return run

    monkeypatch.setattr(bootstrap, "bootstrap_node", fake("bootstrap"))
    monkeypatch.setattr(code_sync, "sync_node", fake("sync"))
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        await pilot.press("b", "s")
        assert isinstance(app.screen, SyncModal)
        await pilot.press("enter")  # the form as it opens: this checkout, no env file here
        await until(pilot, lambda: "synced 2 worker(s)" in ops_text(screen), "sync to finish")
        await until(pilot, lambda: "bootstrapped 2 worker(s)" in ops_text(screen), "bootstrap to finish")
        assert sorted(calls) == [("bootstrap", "pod-a"), ("sync", "pod-a")]
        assert "bootstrap pod-a: [1] installing the trainer's dependencies" in ops_text(screen)


async def test_l_validates_the_config_in_the_form_before_anything_is_sent(monkeypatch, tmp_path):
    from tpu_console.launch import start as launch_module

    launched = []

    async def fake_launch(providers, node, config, overrides, env_file, **kw):
        launched.append((node, Path(config).name, overrides, env_file, kw["kill_stale"]))
        return SimpleNamespace(
            run_id="20250314-120000-abcd",
            ok=True,
            workers=[0, 1, 2, 3],
            starts=[SimpleNamespace(worker=w, ok=True, pgid=100 + w, error=None) for w in range(4)],
        )

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test(size=(120, 45)) as pilot:
        screen = await started(pilot, app)
        await pilot.press("l")
        assert isinstance(app.screen, LaunchModal)
        modal = app.screen
        modal.query_one("#path", Input).value = str(TINY)
        modal.query_one("#make-inputs", Checkbox).value = False  # offered for the tiny config, not wanted
        modal.query_one("#overrides", Input).value = "rollout.batch_size=3"  # 3 prompts over 4 workers
        await submit(pilot, modal, "#overrides")
        assert "3 prompts do not split over 4 processes" in str(modal.query_one("#error", Static).render())
        modal.query_one("#overrides", Input).value = "rollout.nn=2"
        await submit(pilot, modal, "#overrides")
        assert "rollout.nn: unknown key" in str(modal.query_one("#error", Static).render())
        modal.query_one("#overrides", Input).value = "steps=3"
        modal.query_one("#env", Input).value = str(tmp_path / "missing.env")
        await submit(pilot, modal, "#env")
        assert "missing.env does not exist" in str(modal.query_one("#error", Static).render())
        assert launched == [] and isinstance(app.screen, LaunchModal)
        modal.query_one("#env", Input).value = ""
        await submit(pilot, modal, "#env")
        await until(
            pilot, lambda: "run 20250314-120000-abcd started on 4 worker(s)" in ops_text(screen), "launch"
        )
        assert launched == [("pod-a", "tiny_local.yaml", ["steps=3"], None, False)]
        assert "[3] started, pgid 103" in ops_text(screen)


async def test_x_stops_the_nodes_run_after_confirming(monkeypatch):
    from tpu_console.launch import stop

    stopped = []

    async def fake_stop(providers, run_id, store=None, grace_s=10.0):
        stopped.append(run_id)
        return SimpleNamespace(state="stopped"), [
            SimpleNamespace(worker=0, outcome="stopped", signal="TERM", exit_status=143, error=None),
            SimpleNamespace(
                worker=1, outcome="unreachable", signal=None, exit_status=None, error="timed out"
            ),
        ]

    monkeypatch.setattr(stop, "stop", fake_stop)
    add_run("pod-a", "20250314-113000-aaaa", finished=False, state="running")
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        # the state first; what the run ran follows where the column has room
        assert str(screen.query_one("#nodes", DataTable).get_row_at(0)[-1]).startswith("running 30m")
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmModal)
        await pilot.press("n")
        assert stopped == []
        await pilot.press("x", "y")
        await until(pilot, lambda: stopped == ["20250314-113000-aaaa"], "the stop")
        await until(
            pilot, lambda: "stop 20250314-113000-aaaa: run stopped" in ops_text(screen), "its outcome"
        )
        assert "stop 20250314-113000-aaaa: [0] stopped by TERM, exit 143" in ops_text(screen)
        assert "stop 20250314-113000-aaaa: [1] unreachable: timed out" in ops_text(screen)


async def test_enter_opens_the_nodes_latest_run_and_says_when_there_is_none():
    from tpu_console.tui.screens.run_screen import RunScreen

    add_run("pod-b", "20250314-113000-bbbb", finished=True, state="succeeded")
    app = app_with(FakeProvider([make_node("pod-a"), make_node("pod-b")]))
    async with app.run_test() as pilot:
        await started(pilot, app)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodesScreen)
        assert "pod-a has no runs yet" in [n.message for n in app._notifications][-1]
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run dashboard")
        assert app.screen.run_id == "20250314-113000-bbbb"


async def test_a_run_launched_elsewhere_shows_without_r_and_enter_opens_it():
    """The CLI (another process) launches on a node the app shows: the table names the new run within a
    second or two, with no listing of the nodes, and `enter` opens the latest run even before that."""
    from tpu_console.tui.screens.run_screen import RunScreen

    add_run("pod-a", "20250314-113000-aaaa", finished=True, state="succeeded")
    provider = FakeProvider([make_node("pod-a")])
    app = app_with(provider)  # refresh_every: an hour, so no timed listing comes to the rescue
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await started(pilot, app)
        table = screen.query_one(NodeTable)

        def run_cell() -> str:
            row = table.get_row_at(0)
            return " ".join(str(cell) for cell in row)

        assert "succeeded 5m ago" in run_cell()
        listings = provider.list_calls
        add_run("pod-a", "20250314-114500-bbbb", finished=False, state="running")  # as `launch` records it
        await pilot.press("enter")  # at once, before the screen has looked at the history
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run dashboard")
        assert app.screen.run_id == "20250314-114500-bbbb"
        await pilot.press("escape")
        await until(pilot, lambda: "running" in run_cell(), "the history read again")  # bbbb, in the table

        add_run("pod-a", "20250314-115000-cccc", finished=False, state="running")
        await until(pilot, lambda: screen.listing.latest_run(make_node("pod-a")).run_id.endswith("cccc"),
                    "the history read again")
        assert "running" in run_cell()
        assert provider.list_calls == listings  # the history alone, no listing of the nodes
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run dashboard")
        assert app.screen.run_id == "20250314-115000-cccc"


async def test_slash_filters_the_table_and_escape_clears_it():
    app = app_with(FakeProvider([make_node("grpo-a"), make_node("bench-b"), make_node("grpo-c")]))
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        await pilot.press("slash", *"grpo")
        table = screen.query_one("#nodes", DataTable)
        assert [table.get_row_at(i)[0] for i in range(table.row_count)] == ["grpo-a", "grpo-c"]
        assert "(2 match /grpo)" in str(screen.query_one("#status", Static).render())
        await pilot.press("enter", "escape")
        assert table.row_count == 3 and screen.filter_text == ""


async def test_a_filter_that_matches_no_node_names_the_nodes_it_may_be_a_typo_of():
    app = app_with(FakeProvider([make_node("grpo-a"), make_node("bench-b")]))
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        await pilot.press("slash", *"grop-a")
        assert screen.query_one("#nodes", DataTable).row_count == 0
        status = screen.query_one("#status", Static)
        assert "(0 match /grop-a (did you mean 'grpo-a'?))" in str(status.render())
        await pilot.press("backspace", "backspace", *"zz")
        assert "(0 match /gropzz)" in str(status.render())  # like no node: no guess


async def test_two_nodes_of_one_name_in_two_zones_are_two_rows():
    # a race's losers left behind (say the app was killed mid-race): gcp names are unique per zone only
    provider = FakeProvider()
    provider.nodes = {zone: make_node("grpo", zone=zone) for zone in ("europe-west4-a", "us-east5-b")}
    app = app_with(provider)
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        table = screen.query_one("#nodes", DataTable)
        assert sorted(str(table.get_row_at(i)[1]) for i in range(table.row_count)) == [
            "europe-west4-a", "us-east5-b"
        ]
        assert "2 nodes ·" in str(screen.query_one("#status", Static).render())  # no "match /" unfiltered


async def test_runs_screen_marks_runs_and_compares_them():
    add_run(
        "pod-a",
        "20250314-110000-aaaa",
        finished=True,
        state="succeeded",
        price_per_hour=10.0,
        summary={"time/train/step_avg_last10_s": 10.0, "throughput/train/valid_tokens_per_s": 4000.0},
    )
    add_run(
        "pod-a",
        "20250314-113000-bbbb",
        finished=True,
        state="succeeded",
        price_per_hour=10.0,
        summary={"time/train/step_avg_last10_s": 15.0, "throughput/train/valid_tokens_per_s": 2000.0},
    )
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test(size=(140, 40)) as pilot:
        await started(pilot, app)
        await pilot.press("R")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        await until(pilot, lambda: screen.listings >= 1, "the history")
        await pilot.press("c")
        assert "mark two or more runs" in [n.message for n in app._notifications][-1]
        await pilot.press("space", "down", "space", "c")
        assert isinstance(app.screen, CompareModal)
        rows = {r[0]: r for r in app.screen.cells}
        # A is the newest, marked first
        assert rows["step time, avg of last 10 (s)"][1:] == ("15", "10", "-33.3%")
        assert rows["valid tokens/s"][3] == "+100.0%"
        await pilot.press("escape", "escape")
        assert isinstance(app.screen, NodesScreen)


async def test_the_run_column_shows_what_the_workers_say_not_a_stale_record(monkeypatch, probes):
    """A run recorded `running` that ended while nobody looked: the refresh probes it and shows the end."""
    from tpu_console.observe import lookup

    async def observe(providers, records, store, *args, **kwargs):
        probes.append([r.run_id for r in records])
        for record in records:
            store.update(record.run_id, "succeeded", finished=True)
        return [lookup.RunView(record=r, state="succeeded", workers=[], live=True) for r in records]

    monkeypatch.setattr(lookup, "observe", observe)
    add_run("pod-a", "20250314-113000-aaaa", finished=False, state="running")
    add_run("pod-p", "20250314-113000-pppp", finished=False, state="running")
    add_run("pod-b", "20250314-110000-bbbb", finished=True, state="failed")
    app = app_with(
        FakeProvider([make_node("pod-a"), make_node("pod-b"), make_node("pod-p", state=NodeState.PREEMPTED)])
    )
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await started(pilot, app)
        runs = [str(row[-1]) for row in rows(screen)]
        # ended when the probe saw it; each run's state, then what it ran
        assert runs[0].startswith("succeeded ") and runs[0].endswith(" ago tiny_local.yaml")
        assert runs[1:] == ["failed 5m ago tiny_local.yaml", "running 30m tiny_local.yaml"]
        # Only the unfinished run of a READY node is probed: a PREEMPTED node's workers cannot answer.
        assert probes == [["20250314-113000-aaaa"]]
        assert RunStore().get("20250314-113000-aaaa").state == "succeeded"


async def test_several_operations_run_at_once_while_the_table_stays_usable(monkeypatch):
    import asyncio

    from tpu_console.provision import bootstrap, code_sync

    release = asyncio.Event()

    def fake(kind, wait):
        async def run(providers, node, *, progress, on_worker, **kw):
            on_worker(0, f"{kind} begins")
            if wait:
                await release.wait()
            report = SimpleNamespace(versions_label=lambda: "jax=0.10.2")
            return SimpleNamespace(workers=[SimpleNamespace(worker=0, ok=True, error=None, report=report)])

        return run

    monkeypatch.setattr(bootstrap, "bootstrap_node", fake("bootstrap", wait=True))
    monkeypatch.setattr(code_sync, "sync_node", fake("sync", wait=False))
    provider = FakeProvider([make_node("pod-a"), make_node("pod-b")])
    app = app_with(provider)
    async with app.run_test(size=(160, 30)) as pilot:
        screen = await started(pilot, app)
        await pilot.press("b")
        await until(
            pilot, lambda: "bootstrap pod-a: [0] bootstrap begins" in ops_text(screen), "bootstrap to begin"
        )
        assert "running: bootstrap pod-a" in str(screen.query_one("#status", Static).render())
        # While it waits: move, sync another node, refresh; none of it waits for the bootstrap.
        await pilot.press("down", "s", "enter")
        await until(
            pilot, lambda: "sync pod-b: synced 1 worker(s): jax=0.10.2" in ops_text(screen), "the sync"
        )
        listed = provider.list_calls
        await pilot.press("r")
        await until(pilot, lambda: provider.list_calls > listed, "a refresh")
        assert "bootstrapped" not in ops_text(screen) and screen.running == ["bootstrap pod-a"]
        release.set()
        await until(
            pilot, lambda: "bootstrap pod-a: bootstrapped 1 worker(s)" in ops_text(screen), "bootstrap"
        )
        assert screen.running == []


async def test_a_worker_that_fails_bootstrap_is_named_in_red_and_notified(monkeypatch):
    from tpu_console.provision import bootstrap

    async def failing(providers, node, *, progress, on_worker, **kw):
        report = SimpleNamespace(versions_label=lambda: "")
        return SimpleNamespace(
            workers=[
                SimpleNamespace(worker=0, ok=True, error=None, report=report),
                SimpleNamespace(worker=1, ok=False, error="pip: no space left", report=report),
            ]
        )

    monkeypatch.setattr(bootstrap, "bootstrap_node", failing)
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        await pilot.press("b")
        await until(
            pilot, lambda: "failed: worker 1: pip: no space left (1 of 2 failed)" in ops_text(screen), "it"
        )
        assert "bootstrap pod-a: [1] failed: pip: no space left" in ops_text(screen)
        assert "worker 1: pip: no space left" in [n.message for n in app._notifications][-1]


async def test_sync_uploads_the_env_file_and_masks_its_values_in_the_panel(monkeypatch, tmp_path):
    from tpu_console.provision import code_sync

    env = tmp_path / ".env"
    env.write_text("WANDB_API_KEY=sekrit-value-123\n")
    asked = []

    async def sync(providers, node, *, env_file, progress, on_worker, **kw):
        asked.append(env_file)
        on_worker(0, "wrote .env: WANDB_API_KEY=sekrit-value-123")  # a careless layer below
        return SimpleNamespace(
            workers=[
                SimpleNamespace(
                    worker=0, ok=True, error=None, report=SimpleNamespace(versions_label=lambda: "x")
                )
            ]
        )

    monkeypatch.setattr(code_sync, "sync_node", sync)
    options = ConsoleOptions(default_provider="fake", sync_env_file=str(env))
    app = TpuConsoleApp(
        {"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW, options=options
    )
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        await pilot.press("s")
        assert app.screen.query_one("#env", Input).value == str(env)  # ./.env, offered
        await pilot.press("enter")
        await until(pilot, lambda: "synced 1 worker(s)" in ops_text(screen), "the sync")
        assert asked == [str(env)]
        assert "sync pod-a: [0] wrote .env: WANDB_API_KEY=***" in ops_text(screen)
        assert "sekrit" not in ops_text(screen)


async def test_launch_passes_kill_stale_and_fail_fast_from_the_form(monkeypatch):
    from tpu_console.launch import demo
    from tpu_console.launch import start as launch_module

    launched, done = [], []

    async def fake_inputs(providers, node, config, overrides, **kw):
        done.append("inputs")
        kw["on_worker"](0, "the tiny model: made at ~/tiny-qwen2")
        return SimpleNamespace(workers=[SimpleNamespace(worker=w, ok=True, error=None) for w in (0, 1)])

    async def fake_launch(providers, node, config, overrides, env_file, **kw):
        done.append("launch")
        launched.append((kw["kill_stale"], kw["fail_fast"]))
        kw["on_worker"](1, "waiting for the coordinator")
        return SimpleNamespace(
            run_id="20250314-120000-abcd",
            ok=False,
            workers=[0, 1],
            starts=[
                SimpleNamespace(worker=0, ok=True, pgid=100, error=None),
                SimpleNamespace(worker=1, ok=False, pgid=None, error="exited 1 at once"),
            ],
        )

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    monkeypatch.setattr(demo, "make_tiny_inputs", fake_inputs)
    app = app_with(FakeProvider([make_node("pod-a", workers=2)]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await started(pilot, app)
        await pilot.press("l")
        modal = app.screen
        modal.query_one("#path", Input).value = str(TINY)
        modal.query_one("#kill-stale").focus()
        await pilot.press("space", "tab", "space")  # both boxes ticked from the keyboard
        await pilot.press("shift+tab", "shift+tab", "enter")  # back into the env field; enter submits
        await until(pilot, lambda: launched == [(True, True)], "the launch")
        await until(pilot, lambda: "did not start on every worker" in ops_text(screen), "the failure")
        assert "launch pod-a: [1] waiting for the coordinator" in ops_text(screen)
        # the tiny config's inputs, as the form offers them (ticked), made before the launch
        assert done == ["inputs", "launch"] and "[0] the tiny model: made at ~/tiny-qwen2" in ops_text(screen)
        assert "launch pod-a: [1] failed: exited 1 at once" in ops_text(screen)


async def test_keys_that_need_a_node_say_so_on_an_empty_table():
    app = app_with(FakeProvider([]))
    async with app.run_test() as pilot:
        await started(pilot, app)
        for key, doing in (
            ("d", "delete"),
            ("b", "bootstrap"),
            ("s", "sync"),
            ("l", "launch on"),
            ("x", "stop the run of"),
        ):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, NodesScreen)
            assert [n.message for n in app._notifications][-1].startswith(f"select a node to {doing}")


async def test_x_on_a_node_without_a_run_in_progress_asks_nothing():
    add_run("pod-a", "20250314-113000-aaaa", finished=True, state="succeeded")
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test() as pilot:
        await started(pilot, app)
        await pilot.press("x")
        await pilot.pause()
        assert isinstance(app.screen, NodesScreen)
        assert [n.message for n in app._notifications][-1] == "pod-a has no run in progress"


def rows(screen: NodesScreen) -> list[list[str]]:
    table = screen.query_one("#nodes", DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def test_timed_refreshes_probe_runs_at_most_once_a_minute_and_r_always(monkeypatch, probes):
    from tpu_console.tui.screens import nodes_screen

    add_run("pod-a", "20250314-113000-aaaa", finished=False, state="running")
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=0.02, clock=lambda: NOW)
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        await until(pilot, lambda: screen.refreshes >= 4, "timed refreshes")
        assert len(probes) == 1  # the first listing probed; the timed ones within the minute did not
        await pilot.press("r")
        await until(pilot, lambda: len(probes) == 2, "r to probe")
        monkeypatch.setattr(nodes_screen, "PROBE_EVERY_S", 0.0)  # as if a minute went by
        await until(pilot, lambda: len(probes) >= 3, "a timed probe once the minute is over")


async def test_escape_leaves_every_dialog_of_the_nodes_screen_without_doing_anything(monkeypatch):
    from tpu_console.launch import stop
    from tpu_console.tui.modals.help import HelpScreen

    async def must_not_stop(*args, **kwargs):
        raise AssertionError("stop was called after escape")

    monkeypatch.setattr(stop, "stop", must_not_stop)
    add_run("pod-a", "20250314-113000-aaaa", finished=False, state="running")
    provider = FakeProvider([make_node("pod-a")])
    app = app_with(provider)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await started(pilot, app)
        for key, dialog in (
            ("d", DeleteNodeModal),
            ("x", ConfirmModal),
            ("l", LaunchModal),
            ("c", CreateNodeModal),
            ("s", SyncModal),
            ("question_mark", HelpScreen),
        ):
            await pilot.press(key)
            assert isinstance(app.screen, dialog)
            await pilot.press("escape")
            assert app.screen is screen
        await pilot.press("question_mark", "question_mark")  # ? closes help too
        assert app.screen is screen
        await pilot.pause()
        assert provider.deleted == [] and provider.created == [] and screen.running == []


async def test_s_refuses_a_missing_env_file_and_a_git_url_without_its_branch_then_syncs_the_branch(
    monkeypatch, tmp_path
):
    from tpu_console.provision import code_sync

    asked = []

    async def sync(providers, node, *, env_file, git_url, branch, progress, on_worker, **kw):
        asked.append((env_file, git_url, branch))
        return SimpleNamespace(
            workers=[
                SimpleNamespace(
                    worker=0, ok=True, error=None, report=SimpleNamespace(versions_label=lambda: "x")
                )
            ]
        )

    monkeypatch.setattr(code_sync, "sync_node", sync)
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await started(pilot, app)
        await pilot.press("s")
        modal = app.screen
        modal.query_one("#env", Input).value = str(tmp_path / "nope.env")
        await submit(pilot, modal, "#env")
        assert "nope.env does not exist" in str(modal.query_one("#error", Static).render())
        modal.query_one("#env", Input).value = ""
        modal.query_one("#git-url", Input).value = "https://example.com/me/tpu-console.git"
        await submit(pilot, modal, "#git-url")
        assert "a git URL and its branch go together" in str(modal.query_one("#error", Static).render())
        assert asked == [] and app.screen is modal
        modal.query_one("#branch", Input).value = "exp/rollout"
        await submit(pilot, modal, "#branch")
        await until(pilot, lambda: "synced 1 worker(s)" in ops_text(screen), "the sync")
        assert asked == [(None, "https://example.com/me/tpu-console.git", "exp/rollout")]


async def test_a_listing_slower_than_the_interval_is_waited_for_not_cancelled_by_the_next_tick():
    import asyncio

    class SlowProvider(FakeProvider):
        async def list_nodes(self):
            await asyncio.sleep(0.15)  # three ticks of 0.05 s
            return await super().list_nodes()

    provider = SlowProvider([make_node("pod-a")])
    app = TpuConsoleApp({"fake": provider}, refresh_every=0.05, clock=lambda: NOW)
    async with app.run_test() as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.refreshes >= 2, "two slow listings to complete")
        assert screen.query_one("#nodes", DataTable).row_count == 1


async def test_q_asks_first_while_operations_are_under_way(monkeypatch):
    import asyncio

    from tpu_console.provision import bootstrap

    async def endless(providers, node, *, progress, on_worker, **kw):
        await asyncio.Event().wait()

    monkeypatch.setattr(bootstrap, "bootstrap_node", endless)
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await started(pilot, app)
        await pilot.press("b")
        await until(pilot, lambda: screen.running == ["bootstrap pod-a"], "the bootstrap to start")
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmModal)
        assert "1 operation(s) still under way (bootstrap pod-a)" in app.screen.question
        await pilot.press("n")
        assert app.screen is screen and app.is_running and screen.running == ["bootstrap pod-a"]
        await pilot.press("q", "y")
        await pilot.pause()
        assert not app.is_running


async def test_a_launch_refused_for_a_missing_model_reads_whole_in_the_operations_panel(monkeypatch):
    from tpu_console.errors import UserError
    from tpu_console.launch import start as launch_module

    refusal = (
        "model_path ~/tiny-qwen2 does not exist on worker 1 of pod-a: make the tiny model there with "
        "`tpu-console demo pod-a`, or point model_path at a model folder every worker has (or a hub id); "
        "nothing was launched"
    )

    async def refused(*args, **kwargs):
        raise UserError(refusal)

    monkeypatch.setattr(launch_module, "launch", refused)
    app = app_with(FakeProvider([make_node("pod-a")]))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = await started(pilot, app)
        await pilot.press("l")
        modal = app.screen
        modal.query_one("#path", Input).value = str(TINY)
        modal.query_one("#make-inputs", Checkbox).value = False  # so launch's own check speaks
        await submit(pilot, modal, "#path")
        await until(pilot, lambda: "nothing was launched" in ops_text(screen), "the refusal")
        await pilot.pause()
        log = screen.query_one("#ops", OperationsLog)
        rows = [strip.text.rstrip() for strip in log.lines]
        # wrapped at the panel's width: every word of it on screen, the fix included
        assert all(len(row) <= log.size.width for row in rows)
        assert " ".join(" ".join(rows).split()).endswith(f"launch pod-a refused: {refusal}")


async def test_enter_right_after_a_launch_opens_the_new_run_not_the_last_listed(monkeypatch):
    from tpu_console.launch import start as launch_module
    from tpu_console.tui.screens.run_screen import RunScreen

    add_run("pod-a", "20250314-113000-bbbb", finished=True, state="succeeded")

    async def fake_launch(providers, node, config, overrides, env_file, **kw):
        # recorded in the store by launch; the listing learns of it only at its next refresh
        return SimpleNamespace(run_id="20250314-120000-abcd", ok=True, workers=[0],
                               starts=[SimpleNamespace(worker=0, ok=True, pgid=100, error=None)])

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    app = app_with(FakeProvider([make_node("pod-a", workers=1)]))
    async with app.run_test() as pilot:
        screen = await started(pilot, app)
        monkeypatch.setattr(screen, "action_refresh", lambda: None)  # the listing stays as it was
        await pilot.press("l")
        modal = app.screen
        modal.query_one("#path", Input).value = str(TINY)
        modal.query_one("#make-inputs", Checkbox).value = False
        await submit(pilot, modal, "#path")
        await until(pilot, lambda: "started on 1 worker(s)" in ops_text(screen), "the launch")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the run dashboard")
        assert app.screen.run_id == "20250314-120000-abcd"
