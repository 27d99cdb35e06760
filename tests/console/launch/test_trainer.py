"""The whole loop on a node made elsewhere, reached through a stock OpenSSH sshd: bootstrap, sync, launch the
real trainer from the synced environment; it runs to the end, writes its `end` event and exits 0. (The same
loop on a local 2x2 pod runs in test_provision_local.py, after the bootstrap and sync it checks.)"""

from __future__ import annotations

import getpass
import json
import os
import sys
from pathlib import Path

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.fixtures_sshd import sshd  # noqa: F401 - fixture
from tpu_console import cli
from tpu_console.ssh_identity import client_key_path
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = [pytest.mark.usefixtures("console_home"), pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"


# The ssh provider derives the trainer's coordinator port from the node name, "lab" here and in
# tests/console/provision/test_python.py: one xdist worker runs both trainer tests, so they never race
# for that port.
@pytest.mark.xdist_group("openssh-lab")
@pytest.mark.timeout(300)
def test_the_loop_on_an_openssh_node(capsys, tmp_path, tiny_model_dir, console_home, sshd):  # noqa: F811
    """bootstrap, sync and launch through a stock OpenSSH sshd (one host, one CPU device), as on a VM made
    elsewhere. The worker's base interpreter is this machine's Python; its packages are linked, not
    downloaded, because the host is this machine's loopback."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n")
    (console_home / "config.toml").write_text(
        f'[[ssh.nodes]]\nname = "lab"\nhosts = ["127.0.0.1:{sshd.port}"]\nuser = "{getpass.getuser()}"\n'
        f'key = "{client_key_path()}"\nknown_hosts = "{known_hosts}"\n'
    )
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    base_python = os.path.realpath(sys.executable)
    assert cli.main(["bootstrap", "lab", "--python", base_python]) == 0
    assert cli.main(["sync", "lab"]) == 0
    capsys.readouterr()
    argv = ["launch", "lab", "--config", str(CONFIG), "--json", "--set", f"model_path={tiny_model_dir}",
            "--set", f"data.path={data}", "--set", "steps=1", "--set", "eval_every_steps=0",
            "--set", "rollout.global_length=64", "--set", "rollout.max_length_sample=8"]
    status = cli.main(argv)
    out, err = capsys.readouterr()
    assert status == 0, out[-3000:] + err[-2000:]
    run_id = json.loads(out)["run_id"]
    status = cli.main(["logs", "lab", run_id, "--follow", "--lines", "all"])
    out, err = capsys.readouterr()
    assert status == 0, out[-3000:] + err[-2000:]
    folder = sshd.folder / "home" / "tpu-console" / "runs" / run_id
    manifest = json.loads((folder / "launch.json").read_text())
    assert manifest["python"] == "~/tpu-console/env/bin/python" and manifest["code_version"] is not None
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "end" and (folder / "exit").read_text().strip() == "0"
