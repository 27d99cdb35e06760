"""The real app, driven in tmux the way a person drives it, against a local pod and the real trainer:
create a 2-worker pod from the form, bootstrap, sync, launch tiny_local.yaml from the launch form, open the
run, watch steps arrive from both workers and both exit 0, then delete the pod after typing its name."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]
REPO = Path(__file__).resolve().parents[3]


class Tmux:
    def __init__(self, session: str, command: str, env: dict[str, str]) -> None:
        self.session = session
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        subprocess.run(
            [
                "tmux",
                "new-session",
                "-d",
                "-s",
                session,
                "-x",
                "100",
                "-y",
                "30",
                f"cd {shlex.quote(str(REPO))} && env {exports} {command}",
            ],
            check=True,
        )

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.session, *keys], check=True)
        time.sleep(0.3)

    def type(self, text: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.session, "-l", text], check=True)
        time.sleep(0.3)

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.session], capture_output=True, text=True, check=True
        ).stdout

    def wait_for(self, *texts: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.screen()
            if all(t in shown for t in texts):
                return shown
            time.sleep(0.1)
        raise AssertionError(f"never saw {texts} on screen; it shows:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.session], check=False, capture_output=True)


@pytest.mark.timeout(420)
def test_the_whole_workflow_from_the_keyboard(tmp_path, tiny_model_dir):
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    env = {
        "TPU_CONSOLE_HOME": str(tmp_path / "home"),
        "JAX_PLATFORMS": "cpu",
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
    }
    app = Tmux(f"e2e-{os.getpid()}", f"{shlex.quote(sys.executable)} -m tpu_console", env)
    try:
        app.wait_for("no nodes: press c to create one")
        app.keys("c")
        app.wait_for("Create a node")
        app.type("e2e")
        app.keys("Tab", "Tab")  # past the provider (local is the default) to the type
        app.type("local-2x1")
        app.keys("Enter")
        app.wait_for("e2e is READY")
        app.wait_for("local-2x1", "READY")

        app.keys("b")
        app.wait_for("bootstrapped 2 worker(s)", timeout=240)
        app.keys("s")
        app.wait_for("Sync the code to e2e")
        app.keys("Enter")  # this checkout, as the form offers it
        app.wait_for("synced 2 worker(s)", timeout=120)

        app.keys("l")
        app.wait_for("Launch the trainer on e2e")
        app.keys("Tab")  # from the shipped configs to the file path
        app.type(str(REPO / "trainer" / "configs" / "tiny_local.yaml"))
        app.keys("Tab")
        app.type(
            f"model_path={tiny_model_dir} data.path={data} steps=2 eval_every_steps=0 "
            "rollout.global_length=64 rollout.max_length_sample=8"
        )
        app.keys("Enter")
        app.wait_for("started on 2 worker(s)", timeout=60)

        app.keys("Enter")  # the node's run, in the dashboard
        shown = app.wait_for("ended: SUCCEEDED", timeout=240)
        assert "2 exited of 2" in shown
        for worker in (0, 1):  # the worker grid: exited, at step 2, exit status 0, its step line
            assert re.search(rf"^ {worker}\s+exited\s+2\s+[\d.]+s\s+0\s+step=2 ", shown, re.MULTILINE), shown
        assert "[0]  step=1 " in shown and "[1]  step=1 " in shown  # their output in the interleaved log
        app.keys("Escape")
        app.wait_for("succeeded")  # the node's RUN column

        app.keys("d")
        app.wait_for("Delete local node e2e")
        app.type("e2e")
        app.keys("Enter")
        app.wait_for("e2e deleted", timeout=60)
        app.keys("q")
    finally:
        app.close()
