"""bootstrap on a worker whose only python3 is 3.10, as on the v4/v5e/v5p TPU VM images (Ubuntu 22.04),
reached through a stock OpenSSH sshd whose sessions get a PATH of this machine's tools minus every Python:
- with a python3.11 also on the PATH, bootstrap finds it, records it in python.json, and the bundled trainer
  then runs one step in that environment (the full sync + launch loop over sshd is tests/console/runs/
  test_trainer.py's);
- with nothing but 3.10 and uv, bootstrap asks uv to install one from the configured mirror (a local HTTP
  server here: the tests have no internet), which fails, and the console says so in one line, exit 2."""

from __future__ import annotations

import getpass
import http.server
import json
import os
import shlex
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.fixtures_sshd import Sshd, running_sshd
from tpu_console import cli
from tpu_console.keys import client_key_path
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")

CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
OLD_PYTHONS = sorted(PYENV.glob("3.10.*/bin/python3.10"))
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
    if not OLD_PYTHONS:
        pytest.skip(f"no Python 3.10 under {PYENV} to play the TPU image's python3")
    return OLD_PYTHONS[-1]


@pytest.fixture
def sshd_with_python311(tmp_path: Path, old_python: Path) -> Iterator[Sshd]:
    path = tools_without_python(tmp_path / "bin", old_python, {"python3.11": CONSOLE_PYTHON})
    yield from running_sshd(tmp_path, {"PATH": path})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bootstrap_finds_a_newer_python_and_the_trainer_runs(
    capsys, tmp_path, tiny_model_dir, console_home, sshd_with_python311  # noqa: F811
):
    sshd = sshd_with_python311
    ssh_node(console_home, tmp_path, sshd)
    home = sshd.folder / "home"
    assert cli.main(["exec", "lab", "--", "python3 -V; command -v python3.12 python3.13 || true"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"[0] Python {OLD_PYTHONS[-1].parent.parent.name}"]

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


class _Mirror(http.server.BaseHTTPRequestHandler):
    """A python-build-standalone mirror that has nothing: it records what uv asked for and answers 404."""

    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        self.asked.append(self.path)
        self.send_error(404)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def mirror() -> Iterator[tuple[str, list[str]]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Mirror)
    asked: list[str] = []
    _Mirror.asked = asked
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/pbs", asked
    finally:
        server.shutdown()


def test_without_a_python_uv_installs_from_the_mirror_or_one_line_names_the_fix(
    capsys, tmp_path, console_home, old_python, mirror  # noqa: F811
):
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.skip("uv is not installed beside the console (pip install uv)")
    url, asked = mirror
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
