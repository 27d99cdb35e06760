"""Pilot tests of the create and launch forms' bad input: every problem is named in the form, in one
line with the fix, the form stays open, and nothing reaches a provider or a worker."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from textual.widgets import Checkbox, Input, Select, Static

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.create_node import CreateNodeModal
from tpu_console.tui.modals.launch import LaunchModal
from tpu_console.tui.options import ConsoleOptions

pytestmark = pytest.mark.usefixtures("console_home", "planner")
TINY = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"



class GcpFake(FakeProvider):
    name = "gcp"


async def listed(pilot) -> None:
    for _ in range(300):
        if pilot.app.screen.refreshes:
            return
        await pilot.pause(0.01)
    raise AssertionError("the nodes were never listed")


async def error_after_submit(pilot, modal, field: str) -> str:
    modal.query_one(field, Input).focus()
    await pilot.press("enter")
    await pilot.pause()
    return str(modal.query_one("#error", Static).render())


@pytest.mark.parametrize(("name", "type_", "zones", "problem"), [
    ("", "v6e-16", "us-east5-b", "give the node a name"),
    ("grpo_1", "v6e-16", "us-east5-b", "invalid node name 'grpo_1'"),
    ("taken", "v6e-16", "us-east5-b", "a gcp node named 'taken' already exists; pick another name"),
    ("grpo", "", "us-east5-b", "give an accelerator type, e.g. local-2x2 or v6e-16"),
    ("grpo", "v9-16", "us-east5-b", "v9-16"),
    ("grpo", "v6e-16", " , ", "give at least one zone to try (gcp.zones in config.toml sets the default)"),
])
async def test_create_form_names_each_problem_and_creates_nothing(name, type_, zones, problem):
    gcp = GcpFake([make_node("taken", "gcp")])
    app = TpuConsoleApp({"gcp": gcp}, refresh_every=3600, clock=lambda: NOW,
                        options=ConsoleOptions(default_provider="gcp", zones=["europe-west4-a"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c")
        modal = app.screen
        assert isinstance(modal, CreateNodeModal)
        assert modal.query_one("#zones", Input).value == "europe-west4-a"  # the configured zones, offered
        modal.query_one("#name", Input).value = name
        modal.query_one("#type", Input).value = type_
        modal.query_one("#zones", Input).value = zones
        assert problem in await error_after_submit(pilot, modal, "#zones")
        assert app.screen is modal and gcp.created == []


async def test_create_form_sends_gcps_options_chosen_by_keyboard_to_the_provider():
    gcp = GcpFake([])
    app = TpuConsoleApp({"gcp": gcp}, refresh_every=3600, clock=lambda: NOW,
                        options=ConsoleOptions(default_provider="gcp"))
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c", *"grpo", "tab", "tab", *"v6e-8", "tab", *"us-east5-b, europe-west4-a", "tab")
        assert app.focused.id == "provisioning"
        await pilot.press("space", "down", "enter")  # open the list, pick on-demand
        await pilot.pause()
        # the reservation field is for reservations only: tab skips it
        await pilot.press("tab", *"1h30m", "tab", "space")
        assert app.focused.id == "race" and modal_value(app, "#race") is True
        await pilot.press("ctrl+s")
        for _ in range(300):
            if gcp.created:
                break
            await pilot.pause(0.01)
        (request,) = gcp.created
        assert (request.name, request.accelerator_type, request.zones, request.provisioning) == (
            "grpo", "v6e-8", ("us-east5-b", "europe-west4-a"), "on-demand"
        )
        assert (request.spot, request.valid_for_s, request.race, request.queued) == (
            False, 5400.0, True, True
        )


@pytest.mark.parametrize(("fields", "expected"), [
    ({"provisioning": "reservation", "reservation": "rl-team", "direct": True},
     {"reservation": "rl-team", "queued": False, "spot": False, "best_effort": False}),
    ({"provisioning": "best-effort"},
     {"best_effort": True, "spot": False, "reservation": None, "queued": True}),
])
async def test_create_form_sends_a_reservation_direct_and_best_effort(fields, expected):
    gcp = GcpFake([])
    app = TpuConsoleApp({"gcp": gcp}, refresh_every=3600, clock=lambda: NOW,
                        options=ConsoleOptions(default_provider="gcp", zones=["us-east5-b"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c")
        fill(app.screen, fields)
        await pilot.pause()
        await pilot.press("ctrl+s")
        for _ in range(300):
            if gcp.created:
                break
            await pilot.pause(0.01)
        (request,) = gcp.created
        assert {key: getattr(request, key) for key in expected} == expected


def fill(modal, fields: dict) -> None:
    for key, value in fields.items():
        widget = modal.query_one(f"#{key}")
        widget.value = value


@pytest.mark.parametrize(("fields", "problem"), [
    ({"wait_for": "soon"}, "bad duration 'soon': write it like 2h, 45m, 1h30m or 90s"),
    ({"wait_for": "0m"}, "bad duration '0m': it must be longer than zero"),
    ({"race": True, "direct": True},
     "--race queues a request in every zone at once; it cannot go with --direct"),
    ({"provisioning": "reservation"},
     "--reservation needs the reservation's name (in the zone) or its full path"),
])
async def test_create_form_refuses_a_bad_gcp_option_with_the_clis_line(fields, problem):
    gcp = GcpFake([])
    app = TpuConsoleApp({"gcp": gcp}, refresh_every=3600, clock=lambda: NOW,
                        options=ConsoleOptions(default_provider="gcp", zones=["us-east5-b"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c")
        modal = app.screen
        fill(modal, fields)
        await pilot.pause()
        assert await error_after_submit(pilot, modal, "#name") == problem
        assert app.screen is modal and gcp.created == []


async def test_create_form_tab_visits_every_gcp_field_in_order():
    app = TpuConsoleApp({"gcp": GcpFake([])}, refresh_every=3600, clock=lambda: NOW,
                        options=ConsoleOptions(default_provider="gcp", zones=["us-east5-b"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c")
        modal = app.screen
        assert not modal.query_one("#spot").display  # the provisioning list stands for it on gcp
        assert modal.query_one("#provisioning", Select).value == "spot"  # the default, as a value
        assert modal.query_one("#wait_for", Input).placeholder.startswith("e.g. ")
        assert await tab_through(pilot, 10) == [
            "name", "provider", "type", "zones", "provisioning", "wait_for", "race", "direct", "create",
            "cancel", "name",
        ]
        modal.query_one("#provisioning", Select).value = "reservation"
        await pilot.pause()
        modal.query_one("#provisioning", Select).focus()
        await pilot.pause()
        assert await tab_through(pilot, 1) == ["provisioning", "reservation"]


def modal_value(app, selector: str):
    return app.screen.query_one(selector, Checkbox).value


@pytest.mark.parametrize(
    ("path", "overrides", "env", "problem"),
    [
        ("{missing}", "", "", "does not exist"),
        ("{tiny}", "rollout.batch_size=3", "", "3 prompts do not split over 4 processes"),
        ("{tiny}", "rollout.nn=2", "", "rollout.nn: unknown key"),
        ("{tiny}", "steps", "", "steps"),
        ("{tiny}", "steps=abc", "", "steps"),
        ("{tiny}", "", "{missing_env}", "missing.env does not exist"),
    ],
)
async def test_launch_form_refuses_bad_configs_before_anything_is_sent(
    monkeypatch, tmp_path, path, overrides, env, problem
):
    from tpu_console.launch import start as launch_module

    async def must_not_launch(*args, **kwargs):
        raise AssertionError("launch was called with a config the form should have refused")

    monkeypatch.setattr(launch_module, "launch", must_not_launch)
    fill = {
        "missing": str(tmp_path / "nope.yaml"),
        "tiny": str(TINY),
        "missing_env": str(tmp_path / "missing.env"),
    }
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("l")
        modal = app.screen
        assert isinstance(modal, LaunchModal)
        modal.query_one("#path", Input).value = path.format(**fill)
        modal.query_one("#overrides", Input).value = overrides
        modal.query_one("#env", Input).value = env.format(**fill)
        error = await error_after_submit(pilot, modal, "#overrides")
        assert problem in error and "\n" not in error.strip()
        assert app.screen is modal


async def test_launch_form_shows_the_plan_and_refuses_a_config_that_does_not_fit(planner):
    planner.status, planner.verdict = "does-not-fit", "does not fit: update needs 40.00 GiB of 31.25 GiB"
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 40)) as pilot:
        await listed(pilot)
        await pilot.press("l")
        modal = app.screen
        modal.query_one("#path", Input).value = str(TINY)
        for _ in range(300):  # the plan runs half a second after the last change
            if planner.calls and planner.calls[-1][0] == "tiny_local.yaml":
                break
            await pilot.pause(0.01)
        assert planner.calls[-1] == ("tiny_local.yaml", [], "v6e-16")
        await pilot.pause()
        assert "does not fit" in str(modal.query_one("#plan", Static).render())
        error = await error_after_submit(pilot, modal, "#overrides")
        assert "does not fit: update needs 40.00 GiB" in error and "Skip the plan check" in error
        assert app.screen is modal
        modal.query_one("#no-plan-check", Checkbox).value = True
        modal.query_one("#overrides", Input).focus()
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, LaunchModal)  # launched anyway, as asked


async def test_launch_form_offers_every_shipped_config():
    shipped = sorted(p.name for p in (TINY.parent).glob("*.yaml"))
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("l")
        modal = app.screen
        assert [p.name for p in modal.configs] == shipped
        assert modal.query_one("#shipped", Select).value == str(modal.configs[0])
        await pilot.press("escape")
        assert not isinstance(app.screen, LaunchModal)


@pytest.mark.parametrize(
    ("change", "lower_is_better", "style"),
    [
        ("-21.2%", True, "green"),
        ("-21.2%", False, "red"),
        ("+27.3%", False, "green"),
        ("+7.9%", True, "red"),
        ("+0.0%", True, ""),
        ("-", True, ""),
    ],
)
def test_compare_colours_a_change_by_whether_it_is_better(change, lower_is_better, style):
    from tpu_console.tui.modals.compare import change_style

    assert change_style(change, lower_is_better) == style


async def test_create_form_offers_zones_only_for_gcp_and_creates_locally_without_them():
    class LocalFake(FakeProvider):
        name = "local"

        async def create(self, request, progress=lambda _: None):
            self.created.append(request)  # any type: the form has already checked it
            return make_node(request.name, "local", accelerator_type=request.accelerator_type)

    gcp, local = GcpFake([]), LocalFake([])
    app = TpuConsoleApp(
        {"gcp": gcp, "local": local},
        refresh_every=3600,
        clock=lambda: NOW,
        options=ConsoleOptions(default_provider="gcp", zones=["us-east5-b"]),
    )
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c")
        modal = app.screen
        assert not modal.query_one("#zones", Input).disabled
        modal.query_one("#provider", Select).focus()
        await pilot.press("space", "down", "enter")  # open the list (enter would submit), pick local
        await pilot.pause()
        assert modal.query_one("#provider", Select).value == "local"
        assert modal.query_one("#zones", Input).disabled
        modal.query_one("#name", Input).value = "rehearsal"
        modal.query_one("#type", Input).value = "local-9"
        assert "local-9" in await error_after_submit(pilot, modal, "#type")  # not a local type
        modal.query_one("#type", Input).value = "local-2x2"
        await pilot.press("enter")  # the type field still has focus
        for _ in range(300):
            if local.created:
                break
            await pilot.pause(0.01)
        assert [(r.name, r.accelerator_type, r.zones) for r in local.created] == [
            ("rehearsal", "local-2x2", ())
        ]
        assert gcp.created == []


# -- forms that behave: defaults as values, hints as hints, enter and ctrl+s, the tab order -----------------


class LocalFake(FakeProvider):
    name = "local"

    async def create(self, request, progress=lambda _: None):
        self.created.append(request)
        return make_node(request.name, "local", accelerator_type=request.accelerator_type)


async def tab_through(pilot, presses: int) -> list[str]:
    seen = [pilot.app.focused.id]
    for _ in range(presses):
        await pilot.press("tab")
        seen.append(pilot.app.focused.id)
    return seen


async def test_create_form_enter_creates_with_the_defaults_it_shows_and_tab_visits_every_field():
    local = LocalFake([make_node("demo", "local")])  # `demo` is taken: the next free name is offered
    app = TpuConsoleApp({"local": local}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c")
        modal = app.screen
        assert isinstance(modal, CreateNodeModal)
        assert modal.query_one("#name", Input).value == "demo-2"
        assert modal.query_one("#type", Input).value == "local-2x2"  # a value, not a placeholder
        assert modal.query_one("#zones", Input).placeholder.startswith("e.g. ")  # a hint reads as one
        # zones and the queued request's options are for gcp: a local pod's form is as simple as before
        assert not modal.query_one("#gcp").display and modal.query_one("#spot").display
        assert await tab_through(pilot, 6) == ["name", "provider", "type", "spot", "create", "cancel", "name"]
        await pilot.press("enter")  # in the name field, as the form opened
        await pilot.pause()
        for _ in range(300):
            if local.created:
                break
            await pilot.pause(0.01)
        assert [(r.name, r.accelerator_type) for r in local.created] == [("demo-2", "local-2x2")]


async def test_create_form_type_follows_the_provider_until_one_is_typed():
    app = TpuConsoleApp({"gcp": GcpFake([]), "local": LocalFake([])}, refresh_every=3600, clock=lambda: NOW,
                        options=ConsoleOptions(default_provider="local"))
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        await pilot.press("c")
        modal = app.screen
        modal.query_one("#provider", Select).value = "gcp"
        await pilot.pause()
        assert modal.query_one("#type", Input).value == "v6e-8"
        modal.query_one("#type", Input).value = "v4-16"
        modal.query_one("#provider", Select).value = "local"
        await pilot.pause()
        assert modal.query_one("#type", Input).value == "v4-16"  # typed: kept


async def test_launch_form_enter_on_its_first_field_launches_and_ctrl_s_works_from_a_checkbox(monkeypatch):
    from tpu_console.launch import demo
    from tpu_console.launch import start as launch_module

    launched, made = [], []

    async def fake_inputs(providers, node, config, overrides, **kw):
        made.append(Path(config).name)
        return SimpleNamespace(workers=[SimpleNamespace(worker=0, ok=True, error=None)])

    async def fake_launch(providers, node, config, overrides, env_file, **kw):
        launched.append((Path(config).name, overrides, env_file))
        return SimpleNamespace(run_id="20250314-120000-abcd", ok=True, workers=[0],
                               starts=[SimpleNamespace(worker=0, ok=True, pgid=100, error=None)])

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    monkeypatch.setattr(demo, "make_tiny_inputs", fake_inputs)
    pod = make_node("pod-a", "local", accelerator_type="local-1x4", workers=1, devices=4)
    app = TpuConsoleApp({"local": LocalFake([pod])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        for submit_keys in (["enter"], ["tab", "tab", "tab", "tab", "ctrl+s"]):
            await pilot.press("l")
            modal = app.screen
            assert isinstance(modal, LaunchModal)
            # the shipped tiny config as the value, no overrides, and hints that read as hints
            assert Path(str(modal.query_one("#shipped", Select).value)).name == "tiny_local.yaml"
            assert modal.query_one("#overrides", Input).value == ""
            assert modal.query_one("#overrides", Input).placeholder.startswith("e.g. ")
            assert modal.query_one("#env", Input).placeholder.startswith("e.g. ")
            assert modal.query_one("#make-inputs", Checkbox).display and modal_value(app, "#make-inputs")
            assert app.focused.id == "shipped"
            await pilot.press(*submit_keys)  # enter on the list launches, not opens it; ctrl+s from a box
            for _ in range(300):
                if not isinstance(app.screen, LaunchModal) and len(launched) == len(made):
                    break
                await pilot.pause(0.01)
            assert not isinstance(app.screen, LaunchModal)
        assert launched == [("tiny_local.yaml", [], None)] * 2 and made == ["tiny_local.yaml"] * 2


async def test_launch_form_tab_order_and_no_demo_offer_for_a_real_model():
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 40)) as pilot:
        await listed(pilot)
        await pilot.press("l")
        modal = app.screen
        assert Path(str(modal.query_one("#shipped", Select).value)).name.startswith("qwen25")
        assert not modal.query_one("#make-inputs", Checkbox).display  # a real model is no one's to make
        assert await tab_through(pilot, 18) == [
            "shipped", "path", "job", "overrides", "env", "kill-stale", "fail-fast", "no-plan-check",
            "on-end", "grace", "max-cost", "price-per-hour", "max-hang", "restart-on", "max-restarts",
            "on-straggler", "launch", "cancel", "shipped",
        ]


class DeletableFake(FakeProvider):
    """A provider whose nodes the run's supervisor may delete from the pod (as gcp and local)."""

    def supervisor_delete_target(self, node):
        return {"provider": "fake", "node": node.name}


def fill_supervisor(modal, **fields: str) -> None:
    for name, value in fields.items():
        widget = modal.query_one(f"#{name.replace('_', '-')}")
        widget.value = value


async def test_launch_form_sends_the_supervisors_options_to_launch(monkeypatch):
    from tpu_console.launch import demo
    from tpu_console.launch import start as launch_module
    from tpu_console.observe.supervision import TRANSIENT, SupervisionPolicy

    policies = []

    async def fake_inputs(providers, node, config, overrides, **kw):
        return SimpleNamespace(workers=[SimpleNamespace(worker=0, ok=True, error=None)])

    async def fake_launch(providers, node, config, overrides, env_file, **kw):
        policies.append(kw["policy"])
        return SimpleNamespace(run_id="20250314-120000-abcd", ok=True, workers=[0],
                               starts=[SimpleNamespace(worker=0, ok=True, pgid=100, error=None)])

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    monkeypatch.setattr(demo, "make_tiny_inputs", fake_inputs)
    app = TpuConsoleApp({"fake": DeletableFake([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        for fields in ({}, dict(on_end="delete", grace="5m", max_cost="20", price_per_hour="3.6",
                                max_hang="30m", restart_on="transient", max_restarts="2",
                                on_straggler="restart")):
            await pilot.press("l")
            modal = app.screen
            assert isinstance(modal, LaunchModal)
            modal.query_one("#path", Input).value = str(TINY)
            fill_supervisor(modal, **fields)
            modal.query_one("#fail-fast").focus()
            await pilot.press("space", "ctrl+s")
            for _ in range(300):
                if not isinstance(app.screen, LaunchModal) and len(policies) == (2 if fields else 1):
                    break
                await pilot.pause(0.01)
    # blank options are "off": the supervisor only fails fast; the filled ones reach launch parsed
    assert policies == [
        SupervisionPolicy(fail_fast=True),
        SupervisionPolicy(fail_fast=True, on_end="delete", grace_s=300.0, max_cost=20.0, price_per_hour=3.6,
                          max_hang_s=1800.0, restart_on=TRANSIENT, max_restarts=2, on_straggler="restart"),
    ]


async def test_launch_form_refuses_bad_supervisor_options_with_the_clis_message(monkeypatch):
    from tpu_console.launch import start as launch_module

    async def must_not_launch(*args, **kwargs):
        raise AssertionError("launch was called with options the form should have refused")

    monkeypatch.setattr(launch_module, "launch", must_not_launch)
    cases = [
        (DeletableFake, dict(max_hang="soon"), "--max-hang 'soon' is not a duration"),
        (DeletableFake, dict(max_cost="lots"), "--max-cost 'lots' is not an amount"),
        (DeletableFake, dict(max_cost="5"), "--max-cost needs the node's price"),
        (DeletableFake, dict(restart_on="oom"), "a oom failure fails the same way again"),
        (DeletableFake, dict(grace="5m"), "add --on-end delete"),
        (DeletableFake, dict(max_restarts="5"), "add --restart-on transient"),
        (DeletableFake, dict(restart_on="transient", max_restarts="many"), "--max-restarts 'many'"),
        # a provider that cannot delete its nodes from the pod (as ssh): refused as the CLI refuses it
        (FakeProvider, dict(on_end="delete"), "a fake node cannot be deleted from the pod"),
    ]
    for provider, fields, problem in cases:
        app = TpuConsoleApp({"fake": provider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
        async with app.run_test(size=(100, 30)) as pilot:
            await listed(pilot)
            await pilot.press("l")
            modal = app.screen
            modal.query_one("#path", Input).value = str(TINY)
            fill_supervisor(modal, **fields)
            error = await error_after_submit(pilot, modal, "#max-hang")
            assert problem in error and "\n" not in error.strip(), (fields, error)
            assert app.screen is modal


async def test_sync_form_enter_submits_and_ctrl_s_too(monkeypatch):
    from tpu_console.provision import code_sync

    synced = []

    async def fake_sync(providers, node, **kw):
        synced.append((node, kw["env_file"]))
        return SimpleNamespace(workers=[])

    monkeypatch.setattr(code_sync, "sync_node", fake_sync)
    app = TpuConsoleApp({"fake": FakeProvider([make_node("pod-a")])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 30)) as pilot:
        await listed(pilot)
        for keys in (["enter"], ["tab", "ctrl+s"]):
            await pilot.press("s", *keys)
            for _ in range(300):
                if len(synced) == (1 if keys == ["enter"] else 2):
                    break
                await pilot.pause(0.01)
        assert synced == [("pod-a", None), ("pod-a", None)]
        await pilot.press("s")  # and tab visits every field, then the buttons, and comes round
        assert await tab_through(pilot, 5) == ["env", "git-url", "branch", "sync", "cancel", "env"]
