"""How CLI flags reach settings, providers and create requests (fake providers, no I/O)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tests.fixtures_cli import FakeProvider, console_home, make_node  # noqa: F401 - fixture
from tpu_console import cli
from tpu_console.domain import NodeState
from tpu_console.locations import home

pytestmark = pytest.mark.usefixtures("console_home")


class GcpFake(FakeProvider):
    name = "gcp"


class LocalFake(FakeProvider):
    name = "local"


@pytest.fixture
def fakes(monkeypatch):
    """Replace the real providers; remember the settings the CLI built them from."""
    seen = {}
    providers = {"local": LocalFake(), "gcp": GcpFake()}

    def build(settings):
        seen["settings"] = settings
        return {name: p for name, p in providers.items() if name != "gcp" or settings.gcp.project}

    monkeypatch.setattr(cli, "build_providers", build)
    return providers, seen


def test_create_maps_every_gcp_flag(capsys, fakes):
    providers, seen = fakes
    status = cli.main(
        [
            "create",
            "run-1",
            "--type",
            "v6e-16",
            "--zones",
            "europe-west4-a, us-east5-b",
            "--on-demand",
            "--runtime-version",
            "v2-alpha-tpuv6e",
            "--label",
            "team=rl",
            "--label",
            "run=7",
            "--provider",
            "gcp",
            "--project",
            "my-proj",
            "--internal-ip",
        ]
    )
    assert status == 0, capsys.readouterr().err
    (request,) = providers["gcp"].created
    assert request.name == "run-1" and request.accelerator_type == "v6e-16"
    assert request.zones == ("europe-west4-a", "us-east5-b")
    assert request.spot is False
    assert request.runtime_version == "v2-alpha-tpuv6e"
    assert request.labels == {"team": "rl", "run": "7"}
    assert seen["settings"].gcp.project == "my-proj" and seen["settings"].gcp.internal_ip is True
    assert providers["local"].created == []


def test_create_defaults_spot_and_configured_zones(capsys, fakes):
    (home() / "config.toml").write_text('[gcp]\nproject = "p"\nzones = ["us-east5-b", "us-central1-a"]\n')
    providers, _ = fakes
    assert cli.main(["create", "run-2", "--type", "v6e-8"]) == 0
    (request,) = providers["gcp"].created  # a configured project makes gcp the default for create
    assert request.spot is True and request.zones == ("us-east5-b", "us-central1-a")


def test_create_without_project_defaults_to_local(capsys, fakes):
    providers, _ = fakes
    assert cli.main(["create", "pod-1", "--type", "v-like"]) == 0
    assert [r.name for r in providers["local"].created] == ["pod-1"]


def test_default_provider_setting_wins_over_project(capsys, fakes, monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_DEFAULT_PROVIDER", "local")
    providers, _ = fakes
    assert cli.main(["create", "pod-2", "--type", "v6e-8", "--project", "p"]) == 0
    assert [r.name for r in providers["local"].created] == ["pod-2"] and providers["gcp"].created == []


def test_spot_and_on_demand_are_exclusive(capsys, fakes):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["create", "x", "--type", "v6e-8", "--spot", "--on-demand"])
    assert exit_info.value.code == 2


def test_progress_goes_to_stderr_and_json_to_stdout(capsys, fakes):
    assert cli.main(["create", "run-3", "--type", "v6e-8", "--project", "p", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["node"]["name"] == "run-3"
    assert "creating run-3" in err


def test_project_flag_before_the_verb(capsys, fakes):
    _, seen = fakes
    assert cli.main(["--project", "early", "ls"]) == 0
    assert seen["settings"].gcp.project == "early"


def test_ls_warns_about_problems_and_still_lists(capsys, fakes):
    providers, _ = fakes
    providers["gcp"].nodes["grpo"] = make_node("grpo", "gcp", age=timedelta(hours=2))
    providers["gcp"].problems = ["zone us-east1-d: 503 unavailable"]
    assert cli.main(["ls", "--project", "p"]) == 0
    out, err = capsys.readouterr()
    assert "warning: gcp: zone us-east1-d: 503 unavailable" in err
    (row,) = out.strip().splitlines()[1:]
    # v6e at 1.22 $/chip-hour spot x 16 chips
    cells = row.split()
    assert cells[:7] == ["grpo", "gcp", "v6e-16", "4", "READY", "us-east5-b", "spot"]
    assert cells[8] == "~$19.52"
    assert cells[9].startswith("~$")  # running cost since creation (its value: the --json test)


def test_ls_json_has_price_for_gcp(capsys, fakes):
    providers, _ = fakes
    providers["gcp"].nodes["grpo"] = make_node("grpo", "gcp", spot=False)
    assert cli.main(["ls", "--json", "--project", "p", "--provider", "gcp"]) == 0
    (node,) = json.loads(capsys.readouterr().out)["nodes"]
    assert node["price_per_hour"] == pytest.approx(2.70 * 16)
    assert node["price_on_demand_per_hour"] == pytest.approx(2.70 * 16)
    assert node["price_spot_per_hour"] == pytest.approx(1.22 * 16)
    assert node["cost_since_creation"] == pytest.approx(2.70 * 16 * node["age_s"] / 3600, rel=1e-3)
    assert node["price_currency"] == "USD"


def test_failing_provider_is_a_warning(capsys, fakes):
    providers, _ = fakes
    providers["local"].nodes["pod"] = make_node("pod", "local")
    providers["gcp"].fail_listing = RuntimeError("403 permission denied on project p")
    assert cli.main(["ls", "--project", "p"]) == 0
    out, err = capsys.readouterr()
    assert "warning: gcp: 403 permission denied on project p" in err
    assert "pod" in out


def test_exec_refuses_a_node_that_is_not_ready(capsys, fakes):
    providers, _ = fakes
    providers["local"].nodes["pod"] = make_node("pod", "local", state=NodeState.CREATING)
    assert cli.main(["exec", "pod", "--", "hostname"]) == 2
    assert "node 'pod' is CREATING, not READY" in capsys.readouterr().err
