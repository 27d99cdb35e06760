"""The CLI against the embedded local provider, in-process: ls, create, delete, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.cli import main
from tpu_console.locations import home
from tpu_console.providers.gcp.labels import sanitise
from tpu_console.ssh_identity import user_name

pytestmark = pytest.mark.usefixtures("console_home")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("tpu-console ")


def test_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for verb in ("ls", "create", "delete", "exec"):
        assert verb in out
    assert "exit status" in out


def test_ls_empty(capsys):
    status, out, err = run(capsys, "ls")
    assert status == 0 and out == ""
    assert "no nodes" in err
    status, out, _ = run(capsys, "ls", "--json")
    assert json.loads(out) == {"nodes": [], "requests": [], "problems": []}


def test_create_ls_delete_round_trip(capsys):
    status, out, err = run(capsys, "create", "pod-a", "--type", "local-2x4")
    assert status == 0, err
    assert out.strip() == "created pod-a: local local-2x4, 2 workers in local, READY"
    assert "pod-a" in err  # the provider's progress lines go to stderr
    assert (home() / "local" / "pod-a").is_dir()

    status, out, _ = run(capsys, "ls")
    header, row = out.strip().splitlines()
    assert header.split() == [
        "NAME",
        "PROVIDER",
        "TYPE",
        "WORKERS",
        "STATE",
        "ZONE",
        "SPOT",
        "AGE",
        "PRICE/H",
        "COST",
        "OWNER",
    ]
    assert row.split()[:7] == ["pod-a", "local", "local-2x4", "2", "READY", "local", "-"]
    assert row.split()[-1] == sanitise(user_name())  # a local pod is this console's person's

    status, out, _ = run(capsys, "ls", "--json", "--provider", "local")
    (node,) = json.loads(out)["nodes"]
    assert node["name"] == "pod-a" and node["workers"] == 2 and node["devices_per_worker"] == 4
    assert node["price_per_hour"] is None

    status, out, err = run(capsys, "delete", "pod-a", "--yes")
    assert status == 0, err
    assert out.strip() == "deleted pod-a"
    assert not (home() / "local" / "pod-a").exists()
    assert json.loads(run(capsys, "ls", "--json")[1])["nodes"] == []


def test_create_json(capsys):
    status, out, _ = run(capsys, "create", "pod-j", "--type", "local-v4-16", "--json")
    assert status == 0
    node = json.loads(out)["node"]
    assert (node["name"], node["accelerator_type"], node["workers"], node["devices_per_worker"]) == (
        "pod-j",
        "local-v4-16",
        2,
        4,
    )


def test_delete_json(capsys):
    run(capsys, "create", "pod-d", "--type", "local-1x1")
    status, out, _ = run(capsys, "delete", "pod-d", "--yes", "--json")
    assert status == 0 and json.loads(out) == {"deleted": "pod-d", "provider": "local"}


def assert_one_line_error(status: int, out: str, err: str, *fragments: str) -> None:
    assert status == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[-1]


def test_unknown_type_changes_nothing(capsys):
    assert_one_line_error(
        *run(capsys, "create", "pod-a", "--type", "local-banana"),
        "unknown local accelerator type 'local-banana'",
        "local-2x4",
    )
    assert not (home() / "local" / "pod-a").exists()


def test_invalid_name_is_rejected(capsys):
    assert_one_line_error(*run(capsys, "create", "Pod_A", "--type", "local-1x1"), "invalid node name 'Pod_A'")


def test_taken_name_is_rejected(capsys):
    assert run(capsys, "create", "pod-a", "--type", "local-1x1")[0] == 0
    assert_one_line_error(
        *run(capsys, "create", "pod-a", "--type", "local-2x2"),
        "node name 'pod-a' is taken",
        "tpu-console delete pod-a --yes",
    )
    _, out, _ = run(capsys, "ls", "--json")
    assert json.loads(out)["nodes"][0]["accelerator_type"] == "local-1x1"  # the first one is untouched


def test_delete_without_yes_refuses_and_keeps_the_node(capsys):
    run(capsys, "create", "pod-a", "--type", "local-1x1")
    assert_one_line_error(*run(capsys, "delete", "pod-a"), "refusing to delete pod-a without --yes")
    assert (home() / "local" / "pod-a").is_dir()


def test_delete_unknown_node(capsys):
    assert_one_line_error(
        *run(capsys, "delete", "ghost", "--yes"), "unknown node 'ghost'", "`tpu-console ls` lists the nodes"
    )


def test_json_errors_are_also_a_json_document(capsys):
    status, out, err = run(capsys, "delete", "ghost", "--yes", "--json")
    assert status == 2
    assert json.loads(out) == {"error": "unknown node 'ghost': `tpu-console ls` lists the nodes"}
    assert err.startswith("error: unknown node 'ghost'")


def test_gcp_provider_not_configured(capsys):
    assert_one_line_error(
        *run(capsys, "create", "pod-a", "--type", "v6e-8", "--provider", "gcp"),
        "gcp provider is not configured",
        "--project",
    )


def test_bad_label(capsys):
    assert_one_line_error(
        *run(capsys, "create", "pod-a", "--type", "local-1x1", "--label", "oops"),
        "bad label 'oops'",
        "KEY=VALUE",
    )


def test_bad_config_is_a_one_line_error(capsys):
    (home() / "config.toml").write_text("[gcp]\nprojcet = 'x'\n")
    assert_one_line_error(*run(capsys, "ls"), "unknown setting 'gcp.projcet'")


def test_local_provider_disabled_in_config(capsys):
    (home() / "config.toml").write_text("[local]\nenabled = false\n")
    assert_one_line_error(*run(capsys, "ls", "--provider", "local"), "local provider is disabled")


def test_args_after_double_dash_are_only_for_exec(capsys):
    assert_one_line_error(*run(capsys, "ls", "--", "x"), "unexpected arguments after --")


def test_delete_in_a_terminal_asks_for_the_name(capsys, monkeypatch):
    run(capsys, "create", "pod-a", "--type", "local-1x1")
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "pod-b")
    assert_one_line_error(*run(capsys, "delete", "pod-a"), "the name typed did not match")
    assert (home() / "local" / "pod-a").is_dir()
    monkeypatch.setattr("builtins.input", lambda prompt: "pod-a")
    status, out, _ = run(capsys, "delete", "pod-a")
    assert status == 0 and out.strip() == "deleted pod-a"
    assert not (home() / "local" / "pod-a").exists()


def test_console_script_runs_as_a_process(tmp_path):
    # The installed entry point and `python -m tpu_console` both reach cli.main.
    env = {**os.environ, "TPU_CONSOLE_HOME": str(tmp_path)}
    env = {k: v for k, v in env.items() if not k.startswith("TPU_CONSOLE_") or k == "TPU_CONSOLE_HOME"}
    script = Path(sys.executable).parent / "tpu-console"
    version = subprocess.run(
        [str(script), "--version"], check=False, capture_output=True, text=True, env=env, timeout=60
    )
    assert version.returncode == 0 and version.stdout.startswith("tpu-console ")
    bad = subprocess.run(
        [sys.executable, "-m", "tpu_console", "delete", "ghost", "--yes"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert bad.returncode == 2
    assert bad.stderr == "error: unknown node 'ghost': `tpu-console ls` lists the nodes\n"


def test_runs_sub_commands_leave_every_node_name_listable(capsys):
    # `runs NODE` lists a node's runs; a node named like a sub-command is listed with `runs ls show`.
    assert_one_line_error(*run(capsys, "runs", "ls", "show"), "unknown node 'show'")
    assert_one_line_error(*run(capsys, "runs", "ghost"), "unknown node 'ghost'")
    status, out, _ = run(capsys, "runs", "--json", "show")  # options may come before the sub-command
    assert status == 2 and json.loads(out)["error"].startswith("runs show takes a run id")
    status, out, _ = run(capsys, "runs", "--limit", "3", "--json")
    assert status == 0 and json.loads(out) == {"runs": []}
