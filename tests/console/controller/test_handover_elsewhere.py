"""A managed run recovered by a controller on another machine, which has neither the launching console's
project folder nor its `.env`: the project comes from its snapshot in the controller's store (the same
digest), the `.env` from the controller's own copy, which the console gives it over SFTP (never through
the store); without the copy the recovery waits before making anything, its note naming the fix. A local
pod's run is refused for (and by) a controller of another console home, in one line."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import asyncio
import getpass
import json
import shutil
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.console.controller.test_invariants import drive
from tests.console.controller.test_store_lease import gcs, store  # noqa: F401 - fixtures
from tests.console.launch.test_local import run as run_cli
from tests.console.launch.test_local import worker_home
from tests.emulated_pods import EmulatedPods
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home  # noqa: F401 - fixtures
from tests.fixtures_sshd import running_sshd
from tpu_console import ssh_identity
from tpu_console.controller import env_copies, handover, relaunch, remote, snapshot
from tpu_console.controller import state as st
from tpu_console.controller.handover import Budgets, hand_over
from tpu_console.controller.lease import WHERE_ENV, Lease
from tpu_console.controller.loop import Controller
from tpu_console.controller.state import Action, Incarnation, ManagedRun
from tpu_console.controller.store import FolderStore, open_store
from tpu_console.domain import CreateRequest
from tpu_console.errors import UserError
from tpu_console.history import ownership
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.start import launch
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.providers.local import LocalProvider
from tpu_console.providers.local.jobs import running_job_groups, stop_groups
from tpu_console.providers.nodes import create_node
from tpu_console.provision.project_sync import pack_project
from tpu_console.settings import Settings, SshNodeSettings, load_settings

SECRET = "tok-5ecret-7781"
JOB = f"""\
import os, time
run = os.environ["TPU_CONSOLE_RUN_DIR"]
with open(os.path.join(run, "token-seen"), "w") as seen:
    seen.write(str(os.environ.get("API_TOKEN") == "{SECRET}"))
while True:
    time.sleep(0.1)
"""


def project(folder: Path) -> Path:
    folder.mkdir()
    (folder / "job.py").write_text(JOB)
    (folder / "data.txt").write_text("the same code\n")
    return folder


def worker_file(provider: EmulatedPods, *parts: str) -> Path:
    return provider.pods.store.worker_dir("spot", 0).joinpath("tpu-console", *parts)


@pytest.mark.timeout(240)
async def test_a_controller_of_another_home_recovers_a_command_run_from_its_snapshot_and_env_copy(
        emulator, gcp_home, tmp_path, monkeypatch):
    folder = project(tmp_path / "proj")
    env_file = tmp_path / "secrets.env"
    env_file.write_text(f"API_TOKEN={SECRET}\n")
    pods = tmp_path / "pods"  # the node's workers, reached from either home
    bucket = tmp_path / "bucket"
    store = FolderStore(bucket / "controller")
    laptop = EmulatedPods(emulator.endpoint, PROJECT, ZONES, pods, poll_interval=0.02)
    await create_node({"gcp": laptop}, "gcp", CreateRequest("spot", "local-1x1", zones=(ZONES[0],)))
    spec = JobSpec(command=[sys.executable, "job.py"], project={"dir": str(folder)})
    first = await launch({"gcp": laptop}, "spot", env_file=str(env_file), job=spec)
    assert first.ok
    digest = json.loads(worker_file(laptop, "project.json").read_text())["digest"]
    job = relaunch.job_of_command(spec, str(env_file), SupervisionPolicy())
    managed = hand_over(store, first, job, ZONES, Budgets(confirm_s=0.3, doctor=False))
    assert managed.project["snapshot"] == f"projects/{digest}.tar.gz"
    assert managed.job["spec"]["project"] is None  # the snapshot stands for this machine's folder
    await laptop.close()

    # another machine: its own home, the folder and the .env gone from where they were
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setenv(WHERE_ENV, "ctl")
    shutil.rmtree(folder)
    env_file.rename(tmp_path / "kept-by-the-laptop.env")
    there = EmulatedPods(emulator.endpoint, PROJECT, ZONES, pods, poll_interval=0.02)
    controller = Controller({"gcp": there}, store, poll_s=0.05, read_timeout_s=10.0)
    try:
        emulator.preempt(ZONES[0], "spot")
        await LocalProvider(root=pods).preempt("spot")
        run = await drive(controller, lambda r: "no copy of the run's .env" in (r.note or ""), managed.id,
                          store)
        assert run.note.endswith("run `tpu-console controller start --on ctl` from that console, which "
                                 "gives it the .env of every managed run"), run.note
        assert run.intent["action"] == "create" and len(run.incarnations) == 1  # nothing made meanwhile

        # what `controller start --on ctl` gives it (test_the_env_goes_to_the_controller_over_sftp)
        copy = env_copies.copy_path(managed.id)
        copy.parent.mkdir(parents=True)
        copy.write_text(f"API_TOKEN={SECRET}\n")
        run = await drive(controller, lambda r: len(r.incarnations) == 2 and r.current.run_id is not None
                          and r.intent["action"] == "watch", managed.id, store, timeout=150)
        assert json.loads(worker_file(there, "project.json").read_text())["digest"] == digest
        seen = worker_file(there, "runs", run.current.run_id, "token-seen")
        await _until(seen.exists)
        assert seen.read_text() == "True"
    finally:
        await controller.stop()
        stop_groups(running_job_groups(provider_home(there)), grace_s=1.0)
        await there.close()
    stored = [p.read_bytes() for p in bucket.rglob("*") if p.is_file()]
    assert any(b"job.py" in data or len(data) > 100 for data in stored)  # the snapshot is there...
    assert not [data for data in stored if SECRET.encode() in data]  # ...and no secret anywhere


def provider_home(provider: EmulatedPods) -> Path:
    return provider.pods.store.worker_dir("spot", 0)


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.1)


def test_a_snapshot_is_written_once_beside_the_state_on_either_store(store):
    store.put_file("projects/abc.tar.gz", b"first")
    store.put_file("projects/abc.tar.gz", b"second")  # named by its digest: what is there is kept
    assert store.get_file("projects/abc.tar.gz") == b"first"
    assert store.get_file("projects/other.tar.gz") is None
    assert store.names() == []  # beside the state's objects, not among them


def test_a_project_holding_a_dotenv_or_changed_since_its_sync_is_not_put_in_the_store(
        console_home, tmp_path):
    store = FolderStore(tmp_path / "bucket")
    folder = project(tmp_path / "proj")
    digest = pack_project(folder).digest
    kept = snapshot.keep(store, {"dir": str(folder), "digest": digest}, None)
    assert kept["snapshot"] == f"projects/{digest}.tar.gz" and store.get_file(kept["snapshot"])
    assert snapshot.fetch(store, kept).digest == digest  # read back, unpacked, adding up again
    (folder / "data.txt").write_text("edited since\n")
    with pytest.raises(UserError, match="has changed since the run's code"):
        snapshot.keep(store, {"dir": str(folder), "digest": digest}, None)
    (folder / ".env").write_text(f"API_TOKEN={SECRET}\n")
    with pytest.raises(UserError, match=r"holds \.env, a \.env whose secrets would be copied"):
        snapshot.refuse_secrets(pack_project(folder), None)
    with pytest.raises(UserError, match="holds .env"):
        handover.refuse_unrecoverable(store, "gcp", "spot", folder, None)
    assert SECRET.encode() not in b"".join(p.read_bytes() for p in tmp_path.joinpath("bucket").rglob("*")
                                           if p.is_file())


def test_a_local_pods_run_and_a_controller_of_another_home_are_refused_in_one_line(
        console_home, tmp_path, monkeypatch, capsys):
    store = open_store(load_settings())
    handover.refuse_unreachable_pod(store, "local", "pod")  # no controller yet
    Lease(store, where="ctl").acquire()  # this home's controller: it reaches the pod
    handover.refuse_unreachable_pod(store, "local", "pod")
    monkeypatch.setattr(ownership, "home_id", lambda: "0ther0me")  # the same lease, seen from another home
    with pytest.raises(UserError) as refused:
        handover.refuse_unreachable_pod(store, "local", "pod")
    assert str(refused.value) == ("pod is a local pod, whose folders only this console reaches, and the "
                                  "acting controller runs on ctl; stop it there and `tpu-console controller "
                                  "start` here, or launch without --managed")
    handover.refuse_unreachable_pod(store, "gcp", "pod")  # a cloud node is any controller's
    assert run_cli(capsys, "create", "pod", "--type", "local-1x1")[0] == 0
    status, _, err = run_cli(capsys, "launch", "pod", "--managed", "--", "true")
    assert status == 2 and err == f"error: {refused.value}\n", err
    assert not (worker_home(0) / "tpu-console" / "runs").exists()  # nothing launched

    run = ManagedRun(id="m1", provider="local", node="pod", accelerator_type="local-1x1", job={"kind": "x"},
                     zones=[], owner={"user": "a", "host": "laptop-7", "home": "1a2b3c4d"},
                     incarnations=[Incarnation(0, "pod", None, run_id="r1")])
    why = relaunch.blocked(run, Action.WATCH, store)
    assert why == ("pod is a local pod of laptop-7, whose folders only a controller of the console that made "
                   "it can reach; run `tpu-console controller start` there (and stop this one) to recover it")
    run.owner = {"user": "a", "host": socket.gethostname(), "home": ownership.home_id()}
    assert relaunch.blocked(run, Action.WATCH, store) is None


def test_a_controller_without_the_env_names_the_command_that_gives_it(console_home, monkeypatch, tmp_path):
    job = {"env_file": str(tmp_path / "gone.env")}
    monkeypatch.setenv(WHERE_ENV, "gce:us-east5-b/tpu-console-controller")
    assert "run `tpu-console controller start --gce --zone us-east5-b` from that console" in \
        env_copies.missing("m1", job)
    monkeypatch.delenv(WHERE_ENV)  # this machine's own controller: the file it was launched with
    assert env_copies.missing("m1", job) == (f"this controller has no copy of the run's .env and {tmp_path}/"
                                             "gone.env is not here; put the file back there")
    with pytest.raises(UserError, match="no copy of the run's .env"):
        env_copies.env_file_for("m1", job)
    assert env_copies.env_file_for("m1", {"env_file": None}) is None


async def test_a_controller_removes_its_copy_of_the_env_once_the_run_has_ended(console_home, tmp_path):
    store = FolderStore(tmp_path / "bucket")
    st.add(store, ManagedRun(id="m9", provider="gcp", node="spot", accelerator_type="v6e-8",
                             job={"kind": "command", "env_file": "/laptop/.env"}, status="SUCCEEDED",
                             incarnations=[Incarnation(0, "spot", None, run_id="r1")]))
    copy = env_copies.copy_path("m9")
    copy.parent.mkdir(parents=True)
    copy.write_text(f"API_TOKEN={SECRET}\n")
    controller = Controller({}, store, poll_s=0.05)
    try:
        await controller.run_pass()
    finally:
        await controller.stop()
    assert not copy.exists()


async def test_the_env_goes_to_the_controller_over_sftp_never_into_the_store(
        console_home, tmp_path, monkeypatch):
    ssh_identity.client_key_path()  # the console's key, made before sshd authorizes it
    env_file = tmp_path / "secrets.env"
    env_file.write_text(f"API_TOKEN={SECRET}\n")
    settings = Settings.model_validate({"gcp": {"bucket": f"file://{tmp_path}/bucket"}})
    store = open_store(settings)

    def managed(run_id: str, **kw) -> ManagedRun:
        run = ManagedRun(id=run_id, provider="gcp", node="spot", accelerator_type="v6e-8",
                         job={"kind": "command", "env_file": str(env_file)},
                         incarnations=[Incarnation(0, "spot", None, run_id="r1")], **kw)
        st.add(store, run)
        return run

    run, _ended = managed("m7"), managed("m8", status="SUCCEEDED")
    for sshd in running_sshd(tmp_path):
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
        host = remote.RemoteHost("ctl", SshNodeSettings(
            name="ctl", hosts=[f"127.0.0.1:{sshd.port}"], user=getpass.getuser(),
            key=str(ssh_identity.client_key_path()), known_hosts=str(known_hosts)))
        copies = sshd.folder / "home" / remote.HOME_DIR / env_copies.FOLDER
        # `controller start --on ctl`: every managed run not yet ended is given its .env
        async with await remote.fleet_of(host) as fleet:
            assert await remote.give_every_env(fleet, settings) == []
        assert sorted(p.name for p in copies.iterdir()) == ["m7.env"]
        (copies / "m7.env").unlink()
        # a run handed over later: its .env at once to the acting controller on a host started from here
        remote.remember(host)  # as `controller start --on ctl` does
        Lease(store, where="ctl").acquire()
        monkeypatch.setattr(ownership, "home_id", lambda: "c0ntr0ll")  # the lease's, not this console's
        assert await handover.give_env(store, run, settings) is None
        copy = copies / "m7.env"
        assert copy.read_text() == f"API_TOKEN={SECRET}\n" and copy.stat().st_mode & 0o777 == 0o600
        env_file.unlink()
        warning = await handover.give_env(store, run, settings)
        assert warning.startswith("the acting controller (ctl) has no copy of m7's .env (m7: its .env ")
        assert warning.endswith("give it with `tpu-console controller start --on ctl` from this console, or "
                                "it will not recover the run")
    assert not [p for p in tmp_path.joinpath("bucket").rglob("*") if p.is_file() and SECRET in p.read_text()]
