"""A VM's preemption notice on the pod (worker/preemption_notice.py, job_runner.py, supervisor.py): the
watch of the metadata server's keys against a fake one on 127.0.0.1, the job runner passing a notice to a
foreign job (the notice file, SIGTERM, a `preemption` event, the report), and the supervisor passing it to
every other worker and ending the run `preempted`, on a fake clock."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.worker.test_job_runner_steps import StandInSupervisor
from tests.console.worker.test_supervisor import make, start_all
from tests.fake_metadata import FakeMetadata
from tests.processes import wait_for
from tpu_console.fleet.run_recipes import RUNNER_MODULES
from tpu_console.observe import signatures, supervision
from tpu_console.worker import HERE as WORKER_DIR
from tpu_console.worker import preemption_notice as pn
from tpu_console.worker import supervisor as sv


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    fake = FakeMetadata()
    yield fake
    fake.close()


@pytest.fixture
def stand_in() -> Iterator[StandInSupervisor]:
    supervisor = StandInSupervisor()
    yield supervisor
    supervisor.server.shutdown()


def watch(metadata: FakeMetadata) -> tuple[pn.NoticeWatch, list[pn.Notice]]:
    seen: list[pn.Notice] = []
    return pn.NoticeWatch(seen.append, metadata.base, poll_timeout_s=5).start(), seen


def test_the_watch_passes_the_first_notice_once_with_the_vms_seconds_left(metadata):
    w, seen = watch(metadata)
    try:
        wait_for(lambda: sum("wait_for_change=true" in p for p in metadata.asked) >= 2)  # both keys waited on
        metadata.flip(pn.MAINTENANCE_KEY, "MIGRATE_ON_HOST_MAINTENANCE")  # a live migration: the VM stays
        time.sleep(0.5)
        assert seen == []
        before = time.time()
        metadata.flip(pn.PREEMPTED_KEY, "TRUE")
        wait_for(lambda: seen, timeout=5)
        metadata.flip(pn.MAINTENANCE_KEY, "TERMINATE_ON_HOST_MAINTENANCE")
        time.sleep(0.5)
    finally:
        w.stop()
    (notice,) = seen  # once, whatever follows
    assert notice.source == "preempted" and notice.value == "TRUE"
    assert before <= notice.seen_at <= before + 2  # seen at once, not at the next poll
    assert notice.deadline == pytest.approx(notice.seen_at + 30)


def test_host_maintenance_that_stops_the_vm_is_a_notice_with_a_minute(metadata):
    w, seen = watch(metadata)
    try:
        metadata.flip(pn.MAINTENANCE_KEY, "TERMINATE_ON_HOST_MAINTENANCE")
        wait_for(lambda: seen, timeout=5)
    finally:
        w.stop()
    assert seen[0].source == "maintenance" and seen[0].deadline == pytest.approx(seen[0].seen_at + 60)
    assert pn.notice_of(pn.PREEMPTED_KEY, "FALSE") is None
    assert pn.notice_of(pn.MAINTENANCE_KEY, "NONE") is None


def test_a_watch_without_a_metadata_server_says_nothing_and_keeps_trying():
    w, seen = pn.NoticeWatch(lambda n: seen.append(n), "http://127.0.0.1:9/computeMetadata/v1/"), []
    w.start()
    time.sleep(1.5)
    w.stop()
    assert seen == []


FOREIGN = """\
import json, os, signal, sys, time
def on_term(signum, frame):
    notice = json.load(open(os.environ["TPU_CONSOLE_PREEMPTION_FILE"]))
    print(f"checkpointing with {notice['seconds_left']:.0f}s left ({notice['source']})", flush=True)
    open("checkpointed", "w").write(json.dumps(notice))
    sys.exit(143)  # stopped by the SIGTERM, not done (docs/contract.md)
signal.signal(signal.SIGTERM, on_term)
open("ready", "w").close()
while True:
    time.sleep(0.05)
"""


def test_the_runner_passes_a_notice_to_a_foreign_job_and_reports_it(tmp_path, metadata, stand_in):
    folder = tmp_path / "run"
    folder.mkdir()
    # as launch ships them (fleet/run_recipes.py)
    for name in RUNNER_MODULES:
        shutil.copy(WORKER_DIR / name, folder / name)
    job = {"kind": "command", "command": ["python", "foreign.py"], "metrics": {"format": "none"}}
    (folder / "launch.json").write_text(json.dumps({"worker": 1, "provider": "local", "job": job}))
    plan = {"heartbeat_s": 0.2, "signatures": signatures.patterns()}
    (folder / supervision.PLAN_FILE).write_text(json.dumps(plan))
    (folder / "foreign.py").write_text(FOREIGN)
    (folder / pn.PREEMPTION_FILE).write_text("{}")  # an earlier run's, in a reused folder: removed at start
    log = (folder / "output.log").open("ab")
    runner = subprocess.Popen(
        [sys.executable, "job_runner.py", "--", sys.executable, "-u", "foreign.py"], cwd=folder, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True,  # it leads the job's group, as when launched
        env={"PATH": "/usr/bin:/bin", supervision.ADDRESS_ENV: stand_in.address,
             pn.METADATA_HOST_ENV: metadata.host},
    )
    try:
        wait_for(lambda: (folder / "ready").exists(), timeout=30)
        assert not (folder / pn.PREEMPTION_FILE).exists()
        metadata.flip(pn.PREEMPTED_KEY, "TRUE")
        assert runner.wait(timeout=30) == 143  # the job's own status
    finally:
        runner.kill()
        log.close()
    told = json.loads((folder / "checkpointed").read_text())
    assert told["source"] == "preempted" and 25 < told["seconds_left"] <= 30
    output = (folder / "output.log").read_text()
    said = "tpu-console: preemption notice: the VM is preempted: 30s left; SIGTERM to worker 1's job"
    assert said in output
    assert "checkpointing with 30s left (preempted)" in output
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert [(e["kind"], e["process"], e["source"]) for e in events] == [("preemption", 1, "preempted")]
    [notice] = [r for r in stand_in.reports if r["event"] == "notice"]
    assert notice["notice"]["deadline"] == told["deadline"]
    [exit_report] = [r for r in stand_in.reports if r["event"] == "exit"]
    assert exit_report["stopped"] == "preempted" and exit_report["cause"] == "preempted"


def test_the_supervisor_passes_the_notice_to_every_worker_and_the_run_ends_preempted(tmp_path):
    s, clock = make(tmp_path, workers=(0, 1, 2), restart_on=("preempted", "lost_worker"), max_restarts=3)
    start_all(s)
    notice = pn.Notice("preempted", "TRUE").to_json()  # seen now: 30.0s left
    assert s.report({"worker": 2, "event": "notice", "attempt": 0, "notice": notice})["order"] == "run"
    for worker in (0, 1):  # told in their next answer, once
        order = s.report({"worker": worker, "event": "heartbeat", "attempt": 0})
        assert order["order"] == "preempt" and order["notice"]["worker"] == 2
        assert order["notice"]["deadline"] == notice["deadline"]
        assert s.report({"worker": worker, "event": "heartbeat", "attempt": 0})["order"] == "run"
    assert s.report({"worker": 2, "event": "heartbeat", "attempt": 0})["order"] == "run"  # it knew first
    # one job checkpointed and ended; another died as its peers went (a collective): neither is a failure
    assert s.report({"worker": 0, "event": "exit", "attempt": 0, "status": 143, "stopped": "preempted",
                     "cause": "preempted"})["order"] == "done"
    assert s.report({"worker": 1, "event": "exit", "attempt": 0, "status": 1, "cause": "lost_worker"}
                    )["order"] == "done"
    clock.t += 120  # worker 2's VM went before it could say more
    s.tick()
    names = [d["decision"] for d in _decisions(s)]
    assert "restart" not in names and "stop-others" not in names
    assert names.count("preemption-notice") == 1 and s.ended == "preempted"
    [said] = [d for d in _decisions(s) if d["decision"] == "preemption-notice"]
    assert said["message"] == ("worker 2: preempted (TRUE), 30.0s left: its job has SIGTERM to checkpoint; "
                               "passing the notice to worker(s) 0,1")


def _decisions(s) -> list[dict]:
    path = Path(s.folder) / "supervisor.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]



def test_the_supervisor_records_the_run_preempted_when_the_vm_goes_down(tmp_path, monkeypatch):
    s, _ = make(tmp_path)
    start_all(s)
    monkeypatch.setattr(sv, "preemption_notice", pn)  # as on the pod, where it sits beside supervisor.py
    monkeypatch.setattr(pn, "system_going_down", lambda: False)
    assert s.on_sigterm() is False and s.ended is None  # a SIGTERM to the supervisor alone: no end of the run
    monkeypatch.setattr(pn, "system_going_down", lambda: True)  # systemd stopping everything
    assert s.on_sigterm() is True and s.ended == "preempted"
    [ended] = [d for d in _decisions(s) if d["decision"] == "ended"]
    assert ended["outcome"] == "preempted" and "the VM is shutting down" in ended["message"]
