"""The CLI's queued creates against the TPU API emulator, in-process: the timeline, Ctrl-C and what is
asked then, queued requests in `ls` and `delete`, `capacity`, `--zones auto`, and bad flags."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import UTC, datetime

import pytest

from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home  # noqa: F401 - fixtures
from tpu_console import cli
from tpu_console.cli import prompts
from tpu_console.providers import capacity
from tpu_console.providers.gcp import GcpProvider

Z1, Z2, Z3 = ZONES


@pytest.fixture
def gcp_cli(emulator, gcp_home, monkeypatch):
    """The CLI with a gcp project whose API is the emulator (polled every 20 ms)."""
    (gcp_home / "config.toml").write_text(
        f'[gcp]\nproject = "{PROJECT}"\nzones = {json.dumps(ZONES)}\napi_endpoint = "{emulator.endpoint}"\n')

    def build(settings):
        return {"gcp": GcpProvider(settings, poll_interval=0.02, create_timeout=10, delete_timeout=10)}

    monkeypatch.setattr(cli, "build_providers", build)
    return emulator


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_create_queues_by_default_and_prints_the_timeline(capsys, gcp_cli):
    gcp_cli.capacity_after(Z1, 0.2)
    status, out, err = run(capsys, "create", "grpo", "--type", "v6e-8", "--wait-for", "2h")
    assert status == 0, err
    assert out.strip() == f"created grpo: gcp v6e-8, 1 worker in {Z1}, READY"
    assert f"{Z1}: queuing v6e-8 (spot, v6e-ubuntu-2404, valid for 2h00m)" in err
    assert "default service account with the cloud-platform scope, so a run's supervisor" in err
    for state in ("ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE", "node READY"):
        assert f"{Z1}: {state} after " in err
    (sent,) = gcp_cli.queued_created
    assert sent["body"]["queueingPolicy"] == {"validUntilDuration": "7200s"}

    status, out, _ = run(capsys, "ls")
    assert "grpo: queued request grpo" in out

    status, out, _ = run(capsys, "capacity", "--type", "v6e-8")
    header, row = out.strip().splitlines()
    assert header.split()[:4] == ["ZONE", "TYPE", "ATTEMPTS", "READY"]
    assert row.split()[:4] == [Z1, "v6e-8", "1", "1"]
    (record,) = json.loads(run(capsys, "capacity", "--json")[1])["zones"]
    assert (record["zone"], record["attempts"], record["successes"]) == (Z1, 1, 1)
    assert record["median_wait_s"] > 0


def test_direct_keeps_the_create_node_api(capsys, gcp_cli):
    status, _, err = run(capsys, "create", "old-way", "--type", "v6e-8", "--direct")
    assert status == 0, err
    assert gcp_cli.queued_created == [] and f"{Z1}: creating v6e-8 (spot, v6e-ubuntu-2404)" in err
    assert [(a.zone, a.method, a.outcome) for a in capacity.CapacityStore().attempts()] == [
        (Z1, "direct", "ready")]


def interrupt_once_waiting(emulator, zone: str, name: str) -> threading.Thread:
    """Ctrl-C (SIGINT to this process) once the request waits for capacity."""
    def watch() -> None:
        for _ in range(500):
            body = emulator.queued_json(zone, name)
            if body and body["state"]["state"] == "WAITING_FOR_RESOURCES":
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_while_waiting_cancels_the_request_and_confirms_it_is_gone(capsys, gcp_cli):
    gcp_cli.stockout(Z1)
    watcher = interrupt_once_waiting(gcp_cli, Z1, "grpo")
    status, out, err = run(capsys, "create", "grpo", "--type", "v6e-8", "--zones", Z1, "--json")
    watcher.join()
    assert status == 130
    assert json.loads(out) == {"interrupted": True, "requests": [f"{Z1}/grpo"], "cancelled": True}
    assert gcp_cli.queued_json(Z1, "grpo") is None  # nobody to ask (no terminal): cancelled
    assert f"{Z1}: queued request grpo deleted, confirmed gone" in err
    assert err.rstrip().endswith("cancelled: no queued request left behind")


def test_ctrl_c_answered_no_leaves_the_request_and_says_so(capsys, gcp_cli, monkeypatch):
    gcp_cli.stockout(Z1)
    monkeypatch.setattr(prompts, "can_ask", lambda *_a, **_k: True)
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda question: asked.append(question) or "n")
    watcher = interrupt_once_waiting(gcp_cli, Z1, "grpo")
    status, _, err = run(capsys, "create", "grpo", "--type", "v6e-8", "--zones", Z1)
    watcher.join()
    assert status == 130
    assert asked == [f"cancel the queued request(s) {Z1}/grpo? [Y/n] "]
    assert gcp_cli.queued_json(Z1, "grpo")["state"]["state"] == "WAITING_FOR_RESOURCES"
    assert f"left queued request(s) {Z1}/grpo waiting" in err

    status, out, _ = run(capsys, "ls")
    assert "grpo" in out and "WAITING" in out
    status, out, err = run(capsys, "delete", "grpo", "--yes")
    assert status == 0 and out.strip() == "deleted queued request grpo", err
    assert gcp_cli.queued_json(Z1, "grpo") is None


def test_ls_flags_a_suspended_request_and_delete_removes_it(capsys, gcp_cli):
    gcp_cli.add_queued(PROJECT, Z2, "parked", "v6e-16")
    gcp_cli.suspend(Z2, "parked")
    gcp_cli.add_queued(PROJECT, Z3, "failed-one", "v6e-8", state="FAILED")
    status, out, _ = run(capsys, "ls")
    assert status == 0
    rows = {line.split()[0]: line for line in out.strip().splitlines()[1:]}
    assert "SUSPENDED (holds quota until deleted)" in rows["parked"] and Z2 in rows["parked"]
    assert "FAILED: no reason given (holds quota until deleted)" in rows["failed-one"]
    requests = {r["name"]: r for r in json.loads(run(capsys, "ls", "--json")[1])["requests"]}
    parked = requests["parked"]
    assert (parked["name"], parked["state"], parked["holds_quota"], parked["has_node"]) == (
        "parked", "SUSPENDED", True, False)

    status, out, err = run(capsys, "delete", "parked", "--yes")
    assert status == 0 and "holds quota until deleted" in err
    assert gcp_cli.queued_json(Z2, "parked") is None


def test_delete_removes_every_request_of_the_name_a_race_left_behind(capsys, gcp_cli):
    # a node made in Z1, and the same name still queued in Z2 and Z3 (a race whose cancel was answered no)
    gcp_cli.add_node(PROJECT, Z1, "grpo", "v6e-8")
    gcp_cli.add_queued(PROJECT, Z2, "grpo", "v6e-8")
    gcp_cli.add_queued(PROJECT, Z3, "grpo", "v6e-8")
    status, out, err = run(capsys, "delete", "grpo", "--yes")
    assert status == 0 and out.strip() == "deleted grpo", err
    for zone in (Z2, Z3):
        assert f"{zone}: deleting the queued request grpo" in err
        assert gcp_cli.queued_json(zone, "grpo") is None
    assert json.loads(run(capsys, "ls", "--json")[1]) == {"nodes": [], "requests": [], "problems": []}


def test_zones_auto_tries_the_proven_zone_first(capsys, gcp_cli):
    store = capacity.CapacityStore()
    now = datetime.now(UTC)
    for zone, outcome in ((Z1, capacity.CAPACITY), (Z3, capacity.READY)):
        attempt = capacity.Attempt("gcp", PROJECT, zone, "v6e-8", "spot", "queued", "earlier", now)
        store.finish(store.start(attempt), outcome, ready_after_s=60.0 if outcome == capacity.READY else None)
    status, _, err = run(capsys, "create", "auto-1", "--type", "v6e-8", "--zones", "auto")
    assert status == 0, err
    assert f"zones by the capacity record: {Z3}, {Z2}, {Z1}" in err
    assert [q["zone"] for q in gcp_cli.queued_created] == [Z3]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--wait-for", "soon"], "bad duration 'soon': write it like 2h"),
        (["--direct", "--race"], "--race queues a request in every zone at once"),
        (["--direct", "--reservation", "r"], "--reservation work through a queued request: drop --direct"),
        (["--type", "v4-16", "--race"], "v4-16 has no queued resources"),
    ],
)
def test_bad_queued_flags_are_refused_before_any_call(capsys, gcp_cli, argv, message):
    base = ["create", "x", "--type", "v6e-8"]
    if "--type" in argv:
        base = ["create", "x"]
    status, out, err = run(capsys, *base, *argv)
    assert status == 2 and message in err and err.startswith("error: ") and err.count("\n") == 1
    assert gcp_cli.queued_created == [] and not [r for r in gcp_cli.requests if r[0] in ("POST", "DELETE")]
