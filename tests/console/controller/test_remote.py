"""`controller start | logs | stop --on HOST`: the host named by an [[ssh.nodes]] entry or user@host[:port],
the refusals (a folder store with a host that is not this machine; a malformed host), the config that is
copied, and, end to end, the console installed and the controller started on a real OpenSSH sshd
(tests/fixtures_sshd.py) with its state in a Cloud Storage emulator's bucket that this console reads."""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import signal
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.console.launch.test_local import run
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.fixtures_sshd import Sshd, running_sshd
from tests.gcs_api_emulator import GcsApiEmulator
from tpu_console import ssh_identity
from tpu_console.controller import remote
from tpu_console.controller.lease import read_lease
from tpu_console.controller.store import open_store
from tpu_console.errors import UserError
from tpu_console.history import bucket_record
from tpu_console.settings import Settings, load_settings

pytestmark = pytest.mark.usefixtures("console_home")


def settings_of(**values) -> Settings:
    return Settings.model_validate(values)


def test_a_host_is_an_ssh_node_by_name_or_user_at_host_port():
    settings = settings_of(ssh={"nodes": [{"name": "lab", "hosts": ["10.0.0.5:2222", "10.0.0.6"],
                                           "user": "me", "key": "/k"}]})
    lab = remote.resolve_host("lab", settings)
    assert (lab.label, lab.ssh.hosts, lab.ssh.user, lab.ssh.key) == ("lab", ["10.0.0.5:2222"], "me", "/k")
    other = remote.resolve_host("alice@ctl.example:2200", settings)
    assert (other.label, other.ssh.hosts, other.ssh.user) == ("alice@ctl.example:2200", ["ctl.example:2200"],
                                                             "alice")
    assert other.ssh.key == str(ssh_identity.client_key_path())  # the console's own key
    assert remote.resolve_host("ctl.example", settings).label == f"{getpass.getuser()}@ctl.example:22"
    for bad in ("@ctl", "a b@c", "alice@ctl:0", "alice@", "x/y"):
        with pytest.raises(UserError, match="--on|ssh host"):
            remote.resolve_host(bad, settings)


def test_a_folder_store_is_refused_for_another_host_and_taken_for_this_machine(capsys):
    far = remote.resolve_host("alice@10.255.255.1", settings_of())
    for settings in (settings_of(), settings_of(gcp={"bucket": "file:///srv/records"})):
        with pytest.raises(UserError, match=r"which alice@10.255.255.1:22 cannot see; set `\[gcp\] bucket"):
            remote.refuse_unshared_store(settings, far)
        remote.refuse_unshared_store(settings, remote.resolve_host("me@127.0.0.1:2222", settings))
    remote.refuse_unshared_store(settings_of(gcp={"bucket": "gs://team"}), far)
    # the CLI: one line, exit 2, before any connection (10.255.255.1 would not answer)
    status, out, err = run(capsys, "controller", "start", "--on", "alice@10.255.255.1")
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("error: the controller's state is in a folder")


def test_the_copied_config_holds_what_the_controller_acts_on_and_reads_back():
    settings = settings_of(
        gcp={"project": "p", "zones": ["us-east5-b"], "bucket": "gs://team/lab"},
        notify={"webhook_url": "https://hooks.example/T0/secret-part"}, keys={"nodes.create": "N"},
        ssh={"nodes": [{"name": "lab", "hosts": ["h1", "h2:2222"], "accept_new": True}]})
    far = remote.resolve_host("alice@ctl.example", settings)
    back = Settings.model_validate(tomllib.loads(remote.config_toml(settings, far)))
    assert back.gcp == settings.gcp and back.ssh == settings.ssh and back.workers == settings.workers
    assert back.notify.webhook_url.get_secret_value() == "https://hooks.example/T0/secret-part"
    assert back.keys == {}  # the app's bindings stay here
    # this machine, no bucket: the controller there keeps its state in this home's folder, not its own
    here = remote.resolve_host("me@127.0.0.1:2222", settings_of())
    back = Settings.model_validate(tomllib.loads(remote.config_toml(settings_of(), here)))
    assert open_store(back).place == open_store(settings_of()).place


@pytest.fixture
def gcs(monkeypatch) -> Iterator[GcsApiEmulator]:
    api = GcsApiEmulator()
    monkeypatch.setenv(bucket_record.EMULATOR_ENV, api.start())
    yield api
    api.stop()


@pytest.fixture
def ctl_host(tmp_path, console_home, gcs) -> Iterator[Sshd]:  # noqa: F811
    """An sshd whose sessions reach the same storage emulator (the "remote" host's own environment)."""
    ssh_identity.client_key_path()  # the console's key, made in this test's home before sshd authorizes it
    for sshd in running_sshd(tmp_path, {bucket_record.EMULATOR_ENV: gcs.endpoint}):
        yield sshd
        pid_file = sshd.folder / "home" / remote.HOME_DIR / "controller" / "daemon.pid"
        if pid_file.exists():  # a test that failed before its `stop --on`: the daemon it started goes
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout} s")


@pytest.mark.slow
def test_start_on_an_ssh_host_installs_the_console_there_and_its_lease_names_it(
        capsys, ctl_host, console_home, tmp_path):  # noqa: F811
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{ctl_host.port} {ctl_host.host_key_line}\n")
    console_home.mkdir(parents=True, exist_ok=True)
    (console_home / "config.toml").write_text(
        '[gcp]\nbucket = "gs://team-runs/lab"\n\n[[ssh.nodes]]\nname = "ctl"\n'
        f'hosts = ["127.0.0.1:{ctl_host.port}"]\nuser = "{getpass.getuser()}"\n'
        f'key = "{ssh_identity.client_key_path()}"\nknown_hosts = "{known_hosts}"\n')
    store = open_store(load_settings())
    status, out, err = run(capsys, "controller", "start", "--on", "ctl")
    assert status == 0 and "controller running on ctl as a detached process" in out, (out, err)
    assert "linked to this machine" in err and "this checkout (" in err
    home = ctl_host.folder / "home" / "tpu-console" / "controller" / "home"
    assert (home / "config.toml").stat().st_mode & 0o777 == 0o600
    # the console there runs from the shipped checkout, which it can build the trainer's wheel from again
    probe = "from tpu_console.provision.code_sync import find_checkout; print(find_checkout())"
    there = subprocess.run([ctl_host.folder / "home" / "tpu-console" / "env" / "bin" / "python", "-c", probe],
                           capture_output=True, text=True, env={"HOME": str(ctl_host.folder / "home")},
                           cwd=ctl_host.folder / "home")  # as there: not this checkout's folder
    assert Path(there.stdout.strip()).parent == ctl_host.folder / "home" / remote.CODE_DIR, there
    try:
        lease = wait_until(lambda: read_lease(store), 60, "the controller there takes the lease")
        assert lease["holder"]["where"] == "ctl"
        status, out, err = run(capsys, "controller", "status")
        assert status == 0 and "acting controller: ctl on " in out and "gs://team-runs/lab/controller/" in out
        assert "this machine: no controller runs here" in out, out
        status, out, err = run(capsys, "controller", "logs", "--on", "ctl")
        assert status == 0 and "serving gs://team-runs/lab/controller/" in out, out
    finally:
        status, out, err = run(capsys, "controller", "stop", "--on", "ctl")
    assert status == 0 and "ctl: stopped the controller (a detached process" in err, err
    assert read_lease(store) is None  # given back at once
    status, out, err = run(capsys, "controller", "status", "--json")
    assert json.loads(out)["lease"] is None
    status, out, err = run(capsys, "controller", "stop", "--on", "ctl")
    assert status == 0 and "no controller runs here" in err


def test_the_shipped_checkout_is_what_the_wheel_is_built_from():
    packed = remote.pack_checkout()
    assert "editables>=0.5" in remote.console_requirements(packed.root)
    assert {"pyproject.toml", "README.md", "tpu_console/controller/remote.py", "trainer/__init__.py"} <= set(
        packed.files)
    assert not [f for f in packed.files if f.startswith(("tests/", "benchmarks/", "docs/"))]
    assert Path(packed.root, "pyproject.toml").is_file()
