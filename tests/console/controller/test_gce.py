"""`controller start --gce`, `stop --gce [--delete]`, `delete-vm`: the controller's VM made, started and
deleted through google-cloud-compute against the Compute API emulator on 127.0.0.1
(tests/compute_api_emulator.py), its SSH waited for on a real sshd standing for the VM's, then handed to
`start --on` (tested end to end in test_remote.py; recorded here)."""

from __future__ import annotations

import getpass
from collections.abc import Iterator

import pytest

from tests.compute_api_emulator import ComputeApiEmulator
from tests.console.launch.test_local import run
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.fixtures_sshd import Sshd
from tpu_console import ssh_identity
from tpu_console.controller import gce, remote

pytestmark = pytest.mark.usefixtures("console_home")
PROJECT, ZONE = "ctl-proj", "us-east5-b"


@pytest.fixture
def compute(console_home, monkeypatch) -> Iterator[ComputeApiEmulator]:  # noqa: F811
    api = ComputeApiEmulator()
    api.start()
    console_home.mkdir(parents=True, exist_ok=True)
    (console_home / "config.toml").write_text(
        f'[gcp]\nproject = "{PROJECT}"\nzones = ["{ZONE}", "europe-west4-a"]\nbucket = "gs://team-runs"\n'
        f'compute_api_endpoint = "{api.endpoint}"\n')
    monkeypatch.setattr(gce, "POLL_S", 0.01)
    yield api
    api.stop()


@pytest.fixture
def started_on(monkeypatch) -> list[remote.RemoteHost]:
    """`start --on`'s install and start, recorded instead of done (test_remote.py does them for real)."""
    hosts: list[remote.RemoteHost] = []

    async def start_on(settings, host, *, detached=False, progress=None):
        hosts.append(host)
        return {"kind": "detached", "detail": "4242", "survives_reboot": False, "log": "/x/controller.log",
                "host": host.label}

    monkeypatch.setattr(remote, "start_on", start_on)
    return hosts


def test_start_gce_makes_the_vm_waits_for_its_ssh_and_starts_the_controller_there(
        capsys, compute, started_on, sshd: Sshd, monkeypatch):
    monkeypatch.setattr(gce, "SSH_PORT", sshd.port)  # the test's sshd stands for the VM's,
    monkeypatch.setattr(gce, "VM_USER", getpass.getuser())  # and its user for the one the guest agent makes
    status, out, err = run(capsys, "controller", "start", "--gce")
    assert status == 0, err
    assert "creating the VM tpu-console-controller (e2-small) in us-east5-b" in err
    assert f"controller running on gce:{ZONE}/tpu-console-controller as a detached process (pid 4242)" in out
    vm = compute.instances[(PROJECT, ZONE, gce.VM_NAME)]
    assert vm["machineType"] == f"zones/{ZONE}/machineTypes/e2-small" and vm["labels"] == {
        "tpu-console": "controller"}
    assert vm["disks"][0]["initializeParams"]["sourceImage"] == gce.IMAGE and vm["disks"][0]["autoDelete"]
    assert vm["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    metadata = {item["key"]: item["value"] for item in vm["metadata"]["items"]}
    assert metadata["ssh-keys"] == f"{getpass.getuser()}:{ssh_identity.public_key_line()}"
    assert "scheduling" not in vm or not vm["scheduling"].get("preemptible")
    # the operations were waited for on the emulator (not compute.googleapis.com, where .result() asks)
    operation = f"/compute/v1/projects/{PROJECT}/zones/{ZONE}/operations/{next(iter(compute.operations))}"
    assert ("GET", operation) in compute.requests
    (host,) = started_on
    assert host.ssh.hosts == [f"127.0.0.1:{sshd.port}"] and host.ssh.user == getpass.getuser()
    assert host.ssh.accept_new and host.ssh.known_hosts.endswith(f"{vm['id']}.known_hosts")
    # the SSH wait met the sshd: its host key was trusted on first use into the VM's own file
    assert sshd.host_key_line.split()[1] in open(host.ssh.known_hosts).read()

    # stopped (TERMINATED), started again: the same VM, started, not made again
    compute.instances[(PROJECT, ZONE, gce.VM_NAME)]["status"] = "TERMINATED"
    def inserts() -> int:
        return sum(1 for verb, path in compute.requests if verb == "POST" and path.endswith("/instances"))

    made = inserts()
    status, out, err = run(capsys, "controller", "start", "--gce")
    assert status == 0 and "starting the VM tpu-console-controller in us-east5-b (terminated)" in err, err
    assert inserts() == made == 1
    assert len(started_on) == 2

    status, out, err = run(capsys, "controller", "delete-vm")
    assert status == 2 and err.startswith("error: delete-vm deletes the VM") and "add --yes" in err
    status, out, err = run(capsys, "controller", "stop", "--gce", "--delete")
    assert status == 0 and "the controller there was not stopped first" in err  # none installed on the sshd
    assert "tpu-console-controller: the VM is deleted with it" in err and not compute.instances
    status, out, err = run(capsys, "controller", "delete-vm", "--yes")
    assert status == 0 and "no VM tpu-console-controller there" in err


def test_start_gce_is_refused_before_anything_is_made_without_a_bucket_or_a_zone(
        capsys, compute, console_home, started_on):  # noqa: F811
    (console_home / "config.toml").write_text(
        f'[gcp]\nproject = "{PROJECT}"\nzones = ["{ZONE}"]\ncompute_api_endpoint = "{compute.endpoint}"\n')
    status, out, err = run(capsys, "controller", "start", "--gce")
    assert status == 2 and err.count("\n") == 1 and "set `[gcp] bucket = \"gs://BUCKET\"`" in err
    (console_home / "config.toml").write_text(
        f'[gcp]\nproject = "{PROJECT}"\nbucket = "gs://b"\ncompute_api_endpoint = "{compute.endpoint}"\n')
    status, out, err = run(capsys, "controller", "start", "--gce")
    assert status == 2 and "pass --zone ZONE or set [gcp] zones" in err
    status, out, err = run(capsys, "controller", "stop", "--delete")
    assert status == 2 and "give it with --gce" in err
    assert not compute.requests and not started_on


def test_an_api_refusal_is_one_line(capsys, compute, started_on):
    compute.fail_next("insert", 403)
    status, out, err = run(capsys, "controller", "start", "--gce", "--zone", "europe-west4-a")
    assert status == 2 and err.count("\n") == 2, err  # the progress line, then the error
    assert "error: Compute Engine refused the insert of the controller's VM: " in err
    assert "injected failure of insert" in err and not compute.instances and not started_on


def test_logs_there_need_a_running_vm(capsys, compute):
    status, out, err = run(capsys, "controller", "logs", "--gce")
    assert status == 2 and "no VM tpu-console-controller in us-east5-b runs the controller" in err
