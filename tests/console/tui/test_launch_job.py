"""The launch form runs your own job instead of the trainer: a command typed as one line or a job file
(`.toml`), with the checks `launch -- CMD` and `launch --job` make; bad input is named in the form and
nothing is launched."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from textual.widgets import Input, Static

from tests.fixtures_cli import NOW, FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.modals.launch import LaunchModal

pytestmark = pytest.mark.usefixtures("console_home")


class DeletableFake(FakeProvider):
    def supervisor_delete_target(self, node):
        return {"provider": "fake", "node": node.name}


async def launch_with(monkeypatch, *forms: dict[str, str]) -> tuple[list[dict], list[str]]:
    """Fill the launch form and submit it, once per `forms` in one app; what reached launch (its keyword
    arguments) and the error each form named ("" when it launched)."""
    from tpu_console.launch import start as launch_module

    launched: list[dict] = []
    errors: list[str] = []

    async def fake_launch(providers, node, config, overrides, env_file, **kw):
        launched.append({"config": config, "overrides": overrides, **kw})
        return SimpleNamespace(run_id="20250314-120000-abcd", ok=True, workers=[0],
                               starts=[SimpleNamespace(worker=0, ok=True, pgid=100, error=None)])

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    # a node of no TPU type: the form plans nothing (the trainer's plan compiles for minutes)
    pod = make_node("pod-a", accelerator_type="local-1x4", workers=1, devices=4)
    app = TpuConsoleApp({"fake": DeletableFake([pod])}, refresh_every=3600, clock=lambda: NOW)
    async with app.run_test(size=(100, 40)) as pilot:
        for _ in range(300):
            if app.screen.refreshes:
                break
            await pilot.pause(0.01)
        for fields in forms:
            before = len(launched)
            await pilot.press("l")
            modal = app.screen
            assert isinstance(modal, LaunchModal)
            for name, value in fields.items():
                modal.query_one(f"#{name}", Input).value = value
            await pilot.pause()
            await pilot.press("ctrl+s")
            error = ""
            for _ in range(300):  # launched, or the form names a problem
                if len(launched) > before:
                    break
                if app.screen is modal and (error := str(modal.query_one("#error", Static).render())):
                    break
                await pilot.pause(0.01)
            errors.append(error)
            if app.screen is modal:
                await pilot.press("escape")
    return launched, errors


async def test_a_command_typed_in_the_form_is_launched_as_a_job(monkeypatch):
    launched, errors = await launch_with(monkeypatch, {"job": "python -m nash_mhc.train --name 'a b'"})
    assert errors == [""]
    (call,) = launched
    assert call["config"] is None
    assert call["job"].command == ["python", "-m", "nash_mhc.train", "--name", "a b"]
    assert call["before_send"] is None  # the trainer's plan is not asked for another program


async def test_a_job_file_brings_its_supervisor_options_and_the_form_adds_to_them(monkeypatch, tmp_path):
    job = tmp_path / "grpo.toml"
    job.write_text('command = "python train.py"\n'
                   '[supervisor]\nmax_restarts = 5\nrestart_on = ["transient"]\non_straggler = "report"\n')
    launched, errors = await launch_with(monkeypatch, {"job": str(job), "max-hang": "30m"})
    assert errors == [""]
    (call,) = launched
    assert call["job"].command == ["python", "train.py"] and call["job"].job_file == str(job.resolve())
    assert call["policy"].max_restarts == 5 and call["policy"].max_hang_s == 1800.0
    assert call["policy"].on_straggler == "report"  # the form's "off" leaves the file's choice


async def test_bad_job_input_is_named_in_the_form_and_nothing_is_launched(monkeypatch):
    cases = [
        ({"job": "missing.toml"}, "job file missing.toml does not exist"),
        ({"job": "python -c 'unclosed"}, "the command cannot be split into words"),
        ({"job": "python train.py", "overrides": "steps=2"}, "overrides set keys of the trainer's config"),
        ({"job": "python train.py", "env": "no-such.env"}, "no-such.env"),
    ]
    launched, errors = await launch_with(monkeypatch, *(fields for fields, _ in cases))
    assert launched == []
    for (_, problem), error in zip(cases, errors, strict=True):
        assert problem in error


async def test_leading_assignments_are_the_commands_environment_as_in_a_shell(monkeypatch):
    launched, errors = await launch_with(
        monkeypatch,
        {"job": "XLA_FLAGS='--xla_dump_to=/tmp/d --x' DEBUG=1 python train.py --note=A=2"},
        {"job": "DEBUG=1"},
        {"job": "HF_TOKEN=abc python train.py"},
    )
    assert errors[0] == ""
    (call,) = launched
    assert call["job"].command == ["python", "train.py", "--note=A=2"]  # not run as a program (exit 127)
    assert call["job"].env == {"XLA_FLAGS": "--xla_dump_to=/tmp/d --x", "DEBUG": "1"}
    assert "DEBUG=... is the environment of a command, but no command follows" in errors[1]
    assert "HF_TOKEN looks like a secret" in errors[2] and "abc" not in errors[2]


async def test_a_max_hang_that_no_step_could_trigger_is_refused_in_the_form(monkeypatch, tmp_path):
    job = tmp_path / "quiet.toml"
    job.write_text('command = "python train.py"\n[metrics]\nformat = "none"\n')
    launched, errors = await launch_with(monkeypatch, {"job": str(job), "max-hang": "30m"})
    assert launched == []
    assert "--max-hang stops a run that makes no step for that long, but metrics format none" in errors[0]
