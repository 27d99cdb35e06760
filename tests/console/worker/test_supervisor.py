"""The run's supervisor (worker/supervisor.py): its decisions on a fake clock, and its delete of a Cloud TPU
node through the TPU API emulator with a token from a fake metadata server on 127.0.0.1, the supervisor
and a job runner running as the processes they are on a pod."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.console.launch.test_run_folder_files import shipped_into_run_folder
from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home, make_provider  # noqa: F401 - fixtures
from tests.processes import wait_for
from tpu_console import worker
from tpu_console.domain import CreateRequest
from tpu_console.fleet import run_recipes
from tpu_console.observe import supervision
from tpu_console.observe.health import Thresholds
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.worker import google_apis, job_runner, node_deletion, report_server, run_record, webhook
from tpu_console.worker import supervisor as sv
from tpu_console.worker.run_record import LaunchRecord

WORKER_DIR = Path(sv.__file__).parent


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def launched(folder: Path, workers=(0, 1), provider: str = "local", node: str = "pod",
             started_at: float = 1000.0, job: dict | None = None,
             policy: SupervisionPolicy | None = None) -> LaunchRecord:
    """Worker 0's launch.json, written into `folder` as launch writes it (before the supervisor starts)."""
    policy = policy or SupervisionPolicy()
    launch = LaunchRecord(
        run_id=folder.name, node=node, provider=provider, workers=list(workers),
        started_at=datetime.fromtimestamp(started_at, UTC).isoformat(), job=job, fail_fast=policy.fail_fast,
        supervised=True, price_per_hour=policy.price_per_hour, worker=0)
    (folder / run_record.FILE).write_bytes(launch.dumps())
    return launch


def make(tmp_path: Path, workers=(0, 1), job: dict | None = None, **policy) -> tuple[sv.Supervisor, Clock]:
    folder = tmp_path / "runs" / "20260101-000000-aaaa"
    folder.mkdir(parents=True, exist_ok=True)
    chosen = SupervisionPolicy(**policy)
    launch = launched(folder, workers, job=job, policy=chosen)
    plan = supervision.plan(policy=chosen, delete_target=None, bind="127.0.0.1", coordinator_host=None)
    clock = Clock()
    return sv.Supervisor(str(folder), plan, launch, clock=clock), clock


def start_all(s: sv.Supervisor) -> None:
    for w in s.workers:
        assert s.report({"worker": w, "event": "start", "attempt": s.attempt})["order"] == "run"


def fail(s: sv.Supervisor, worker: int, cause: str | None, status: int = 1) -> dict:
    return s.report({"worker": worker, "event": "exit", "attempt": s.attempt, "status": status,
                     "cause": cause})


def stopped(s: sv.Supervisor, worker: int) -> dict:
    return s.report({"worker": worker, "event": "exit", "attempt": s.attempt, "status": 143,
                     "stopped": "supervisor"})


def test_restarts_are_counted_per_failure_class_and_an_oom_ends_the_run(tmp_path):
    s, _ = make(tmp_path, restart_on=("distributed_timeout", "tpu_in_use"), max_restarts=1)
    for cause in ("distributed_timeout", "tpu_in_use"):
        start_all(s)
        assert fail(s, 1, cause)["order"] == "wait"
        assert s.report({"worker": 0, "event": "heartbeat", "attempt": s.attempt})["order"] == "stop"
        assert stopped(s, 0)["order"] == "wait"
        s.tick()  # every job has stopped: the restart's second half
        orders = [s.report({"worker": w, "event": "poll", "attempt": s.attempt - 1}) for w in (0, 1)]
        assert [o["order"] for o in orders] == ["restart", "restart"]
    assert s.restarts == {"distributed_timeout": 1, "tpu_in_use": 1}
    start_all(s)
    assert fail(s, 1, "distributed_timeout")["order"] == "done"  # its budget is spent
    assert s.stopping == "fail-fast"
    record = (Path(s.folder) / "supervisor.jsonl").read_text()
    messages = [d.message for d in supervision.parse_decisions(record)]
    assert any("no distributed_timeout restart left (1 of 1 used)" in m for m in messages)

    s2, _ = make(tmp_path / "b", restart_on=supervision.TRANSIENT)
    start_all(s2)
    assert fail(s2, 0, "oom")["order"] == "done" and s2.restarts == {}


def beat(s: sv.Supervisor, clock: Clock, seconds: float, steps: dict[int, int] | None = None,
         step_s: float | None = None) -> None:
    """`seconds` pass with a heartbeat from every worker every 10 s (their steps, when given, at the end)."""
    for _ in range(int(seconds // 10)):
        clock.t += 10
        for w in s.workers:
            s.report({"worker": w, "event": "heartbeat", "attempt": 0, "step": (steps or {}).get(w),
                      "step_s": step_s})
        s.tick()


def test_a_hang_and_a_budget_stop_the_run_and_ask_for_the_node_to_go(tmp_path):
    s, clock = make(tmp_path, max_hang_s=600)
    start_all(s)
    beat(s, clock, 500, {0: 3})
    beat(s, clock, 200, {0: 3, 1: 3})  # worker 1's first step
    assert s.stopping is None  # worker 1 stepped 190 s ago
    beat(s, clock, 420, {0: 3, 1: 3})
    assert s.stopping == "max-hang" and s.delete_reason == "max-hang"

    s, clock = make(tmp_path / "b", max_cost=1.0, price_per_hour=3.6)  # a dollar lasts 1000 s
    start_all(s)
    beat(s, clock, 990)
    assert s.stopping is None
    beat(s, clock, 10)
    assert s.stopping == "max-cost"
    for w in (0, 1):
        assert s.report({"worker": w, "event": "heartbeat", "attempt": 0})["order"] == "stop"
        stopped(s, w)
    s.tick()
    assert s.ended == "stopped" and s.delete_reason == "max-cost"


def test_a_job_before_its_first_step_is_compiling_until_half_an_hour(tmp_path):
    s, clock = make(tmp_path, max_hang_s=600)
    start_all(s)
    beat(s, clock, 1200)  # no step yet: a 3B model's first compile takes minutes, not a hang
    assert s.stopping is None
    beat(s, clock, 610)
    assert s.stopping == "max-hang"

    s, clock = make(tmp_path / "b")
    sent: list[str] = []
    s.notify = lambda event, text, wait=False: sent.append(event)
    start_all(s)
    beat(s, clock, 1790)
    assert sent == []
    beat(s, clock, 20)
    assert sent == ["hung"]  # a hang before the first step is told too


def test_a_command_job_whose_steps_are_not_read_is_never_judged_hung(tmp_path):
    job = {"kind": "command", "command": ["python", "train.py"], "metrics": {"format": "none"}}
    s, clock = make(tmp_path, job=job, max_hang_s=600)
    sent: list[str] = []
    s.notify = lambda event, text, wait=False: sent.append(event)
    start_all(s)
    beat(s, clock, 3600)  # an hour without a step: nothing can be said of a program whose steps are unknown
    assert s.stopping is None and sent == []


def test_a_run_that_stops_stepping_is_said_to_look_hung_once_per_silence(tmp_path):
    s, clock = make(tmp_path)
    sent: list[str] = []
    s.notify = lambda event, text, wait=False: sent.append(event)
    start_all(s)
    beat(s, clock, 10, {0: 1, 1: 1}, step_s=100.0)  # the trainer says a step takes 100 s
    beat(s, clock, 290, {0: 1, 1: 1}, step_s=100.0)
    assert sent == []  # 290 s: under 3 step times
    beat(s, clock, 20, {0: 1, 1: 1}, step_s=100.0)
    assert sent == ["hung"] and s.silent_told
    beat(s, clock, 100, {0: 1, 1: 1}, step_s=100.0)
    assert sent == ["hung"]  # once
    beat(s, clock, 10, {0: 2, 1: 2}, step_s=100.0)
    assert not s.silent_told


def test_the_supervisor_judges_a_hang_by_the_thresholds_the_console_ships(tmp_path, monkeypatch):
    # one home, observe/health.py: the plan carries its Thresholds and the supervisor keeps no copy
    s, _ = make(tmp_path)
    assert s.plan["thresholds"] == dataclasses.asdict(Thresholds())
    assert not any(name.startswith(("STALL", "SILENT")) for name in vars(sv))
    monkeypatch.setattr(supervision, "Thresholds", lambda: Thresholds(stall_floor_s=20.0, silent_s=40.0))
    s, clock = make(tmp_path / "b")
    sent: list[str] = []
    s.notify = lambda event, text, wait=False: sent.append(event)
    start_all(s)
    beat(s, clock, 30)
    assert sent == []
    beat(s, clock, 20)  # no step for 50 s: past the shipped silent_s, long before health's default
    assert sent == ["hung"]
    beat(s, clock, 10, {0: 1, 1: 1})
    beat(s, clock, 30, {0: 1, 1: 1})  # a step, then 30 s without one: past the shipped floor of 20 s
    assert sent == ["hung", "hung"]


def test_the_supervisor_takes_the_runs_facts_from_its_record_and_refuses_to_start_without_one(tmp_path):
    s, clock = make(tmp_path, workers=(0, 2), max_cost=1.0, price_per_hour=3.6)
    assert set(s.workers) == {0, 2} and s.started_at == 1000.0  # the record's workers and start
    assert s.record()["launch"] == s.launch.to_json()
    folder = Path(s.folder)
    (folder / supervision.PLAN_FILE).write_text(json.dumps(s.plan))
    (folder / run_record.FILE).unlink()
    with pytest.raises(SystemExit) as exited:
        sv.main([str(folder)])
    assert str(exited.value) == (f"error: run {folder.name} has no readable launch.json (No such file or "
                                 "directory): launch writes it first; launch the run again")
    assert not (folder / supervision.PORT_FILE).exists()


def test_the_supervisor_and_a_runner_work_from_the_files_launch_ships_alone(tmp_path):
    """As on a pod: the run folder holds only what launch uploads, and nothing of the console is importable
    (-E -s -S: no PYTHONPATH, no site-packages), so a module left out of the upload fails here."""
    folder = tmp_path / "runs" / "20260101-000000-aaaa"
    folder.mkdir(parents=True)
    for name in shipped_into_run_folder():
        (folder / name).write_bytes(worker.source(name))
    policy = SupervisionPolicy(heartbeat_s=0.2)
    launched(folder, [0], policy=policy)
    plan = supervision.plan(policy=policy, delete_target=None, bind="127.0.0.1", coordinator_host=None)
    (folder / supervision.PLAN_FILE).write_text(json.dumps(plan))
    alone, env = [sys.executable, "-E", "-s", "-S"], {"PATH": os.environ["PATH"]}
    supervisor = subprocess.Popen([*alone, "supervisor.py", "."], cwd=folder, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (folder / report_server.PORT_FILE).exists() or supervisor.poll() is not None)
        address = f"127.0.0.1:{(folder / report_server.PORT_FILE).read_text().strip()}"
        runner = subprocess.run([*alone, "job_runner.py", "--", "true"], cwd=folder, timeout=60, text=True,
                                env={**env, supervision.ADDRESS_ENV: address}, capture_output=True)
        assert runner.returncode == 0, runner.stdout + runner.stderr
        out, _ = supervisor.communicate(timeout=60)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, out
    said = supervision.parse_decisions((folder / supervision.DECISIONS_FILE).read_text())
    assert [(d.decision, d.fields.get("outcome")) for d in said] == [("started", None),
                                                                     ("ended", "succeeded")]


def test_the_run_folders_names_are_the_consoles_on_both_sides():
    assert (sv.PLAN_FILE, webhook.NOTIFY_FILE, sv.DECISIONS_FILE, report_server.PORT_FILE,
            report_server.PID_FILE) == (
        supervision.PLAN_FILE, supervision.NOTIFY_FILE, supervision.DECISIONS_FILE, supervision.PORT_FILE,
        supervision.PID_FILE)
    assert (job_runner.PLAN_FILE, job_runner.ADDRESS_ENV) == (supervision.PLAN_FILE, supervision.ADDRESS_ENV)
    assert f"-s {supervision.PORT_FILE} " in run_recipes.start_supervisor("20260101-000000-aaaa", "python3")
    assert supervision.PID_FILE in run_recipes.stop_supervisor("20260101-000000-aaaa")


def test_without_fail_fast_a_failure_is_told_as_a_hang_of_the_others(tmp_path):
    s, _ = make(tmp_path, workers=(0, 1, 2))
    sent: list[tuple[str, str]] = []
    s.notify = lambda event, text, wait=False: sent.append((event, text))
    start_all(s)
    assert fail(s, 1, "exception")["order"] == "done" and s.stopping is None
    assert sent == [("hung", "worker 1 exited 1 (exception); worker(s) 0,2 still run and will likely hang in "
                             "a collective: stop them (tpu-console stop)")]


def test_a_lost_worker_stops_the_others_and_a_newer_run_keeps_the_node(tmp_path):
    s, clock = make(tmp_path, fail_fast=True, workers=(0, 1, 2))
    start_all(s)
    clock.t += 30
    for w in (0, 1):
        s.report({"worker": w, "event": "heartbeat", "attempt": 0})
    clock.t += 31  # worker 2 silent for 61 s
    s.tick()
    assert s.workers[2].state == "lost" and s.stopping == "fail-fast"
    assert (tmp_path / "runs").is_dir() and node_deletion.newer_run(s.folder) is None
    (tmp_path / "runs" / "20260101-000001-bbbb").mkdir()
    assert node_deletion.newer_run(s.folder) == "20260101-000001-bbbb"


@pytest.fixture
def metadata_server():
    """The GCE metadata server's token endpoint, on 127.0.0.1; it answers only with Metadata-Flavor."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.headers.get("Metadata-Flavor") != "Google" or not self.path.endswith(
                    "/instance/service-accounts/default/token"):
                self.send_response(403)
                self.end_headers()
                return
            asked.append(self.path)
            body = json.dumps({"access_token": "ya29.fake", "expires_in": 3599, "token_type": "Bearer"})
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.asked = asked
    server.url = f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1"
    yield server
    server.shutdown()


async def test_on_gcp_the_supervisor_deletes_the_node_through_the_api_with_the_vms_token(
    tmp_path, emulator, make_provider, metadata_server
):
    provider = make_provider()
    node = await provider.create(CreateRequest(name="night", accelerator_type="v6e-8", zones=[ZONES[0]]))
    # `create` gave the VM the service account scope its supervisor needs
    body = emulator.node_json(ZONES[0], "night")
    assert body["serviceAccount"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]

    target = {**provider.supervisor_delete_target(node), "metadata_url": metadata_server.url}
    assert target["node"] == f"projects/{PROJECT}/locations/{ZONES[0]}/nodes/night"
    folder = tmp_path / "runs" / "20260101-000000-aaaa"
    folder.mkdir(parents=True)
    policy = SupervisionPolicy(on_end="delete", grace_s=0, heartbeat_s=0.2)
    launched(folder, [0], provider="gcp", node="night", started_at=0.0, policy=policy)
    plan = supervision.plan(policy=policy, delete_target=target, bind="127.0.0.1", coordinator_host=None)
    (folder / supervision.PLAN_FILE).write_text(json.dumps(plan))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TPU_CONSOLE_")}
    supervisor = subprocess.Popen([sys.executable, str(WORKER_DIR / "supervisor.py"), str(folder)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: (folder / supervision.PORT_FILE).exists())
        port = (folder / supervision.PORT_FILE).read_text().strip()
        runner = subprocess.run(
            [sys.executable, str(WORKER_DIR / "job_runner.py"), "--", "true"], cwd=folder, timeout=60,
            env={**env, supervision.ADDRESS_ENV: f"127.0.0.1:{port}"},
        )
        assert runner.returncode == 0
        out, _ = supervisor.communicate(timeout=60)
    finally:
        supervisor.kill()
    assert supervisor.returncode == 0, out
    assert "deleted: node night deleted" in out
    assert len(metadata_server.asked) == 1
    assert [n.name for n in (await provider.list_nodes()).nodes if n.state.value != "DELETING"] == []


async def test_a_queued_node_has_the_scope_too_and_the_supervisor_deletes_its_request(
    emulator, make_provider, metadata_server
):
    provider = make_provider()
    node = await provider.create(CreateRequest(name="qn", accelerator_type="v6e-8", zones=[ZONES[0]],
                                               queued=True))
    spec = emulator.queued_json(ZONES[0], "qn")["tpu"]["nodeSpec"][0]["node"]
    assert spec["serviceAccount"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    target = {**provider.supervisor_delete_target(node), "metadata_url": metadata_server.url}
    assert target["queued_resource"] == f"projects/{PROJECT}/locations/{ZONES[0]}/queuedResources/qn"
    await asyncio.to_thread(google_apis.delete_tpu_node, target)
    wait_for(lambda: emulator.queued_json(ZONES[0], "qn") is None, timeout=10)
    assert len(metadata_server.asked) == 1


def test_a_node_of_a_queued_request_is_deleted_with_its_request(metadata_server):
    deleted: list[tuple[str, str | None]] = []

    class Api(BaseHTTPRequestHandler):
        def do_DELETE(self):  # noqa: N802
            deleted.append((self.path, self.headers.get("Authorization")))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    api = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    try:
        google_apis.delete_tpu_node({
            "api": f"http://127.0.0.1:{api.server_address[1]}", "metadata_url": metadata_server.url,
            "node": "projects/p/locations/z/nodes/n",
            "queued_resource": "projects/p/locations/z/queuedResources/n",
        })
    finally:
        api.shutdown()
    assert deleted == [("/v2/projects/p/locations/z/queuedResources/n?force=true", "Bearer ya29.fake")]
