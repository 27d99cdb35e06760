"""The newcomer's first session, driven in tmux at 100x30 the way a person drives it: `scripts/console`
with an empty home, `c` with the form's defaults, `b`, `s`, `l` with the tiny config as offered (its model
and data made on the workers by the form's offer, no path typed), the run to SUCCEEDED on both workers with
its plots, a second run stopped with `x` that reads stopped, and `d` after typing the pod's name."""

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

from tpu_console.providers.local.jobs import running_job_groups, stop_groups

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]
REPO = Path(__file__).resolve().parents[3]


class Tmux:
    def __init__(self, session: str, command: str, env: dict[str, str]) -> None:
        self.session = session
        self.unheeded: list[str] = []
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

    def press_until(self, key: str, *texts: str, tries: int = 3, timeout: float = 10) -> str:
        """`key`, then the screen once it shows `texts`; the key again (at most `tries` times in all) when
        it did not. Under a loaded machine (trainer jobs on both cores) a key pressed in the run dashboard
        was seen to go unheeded in this test, never by hand nor under Pilot; `unheeded` counts them."""
        for _ in range(tries - 1):
            self.keys(key)
            try:
                return self.wait_for(*texts, timeout=timeout)
            except AssertionError:
                self.unheeded.append(key)
        self.keys(key)
        return self.wait_for(*texts, timeout=timeout)

    def wait_for_line(self, pattern: str, timeout: float = 60) -> str:
        """The screen once a whole line of it matches `pattern` (a frame can arrive in pieces)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = self.screen()
            if any(re.fullmatch(pattern, line) for line in shown.splitlines()):
                return shown
            time.sleep(0.1)
        raise AssertionError(f"never saw a line like {pattern!r}; it shows:\n{self.screen()}")

    def click(self, x: int, y: int) -> None:
        """A left click at column `x`, row `y` (from 0), sent as the terminal reports one (SGR mouse)."""
        sgr = f"\x1b[<0;{x + 1};{y + 1}M\x1b[<0;{x + 1};{y + 1}m"
        subprocess.run(["tmux", "send-keys", "-t", self.session, "-H", *(f"{b:02x}" for b in sgr.encode())],
                       check=True)
        time.sleep(0.3)

    def dismiss_toasts(self, most: int = 6) -> None:
        """Click the notifications away, as a person does, rather than wait out their timeouts (20 s for
        the supervisor's): they cover the bottom of the screen. A click that missed costs nothing; what is
        still there goes at its timeout."""
        for _ in range(most):
            rows = [(row, line.index(TOAST_EDGE)) for row, line in enumerate(self.screen().splitlines())
                    if TOAST_EDGE in line]
            if not rows:
                return
            row, column = rows[0]  # the top toast (a click anywhere on one closes it)
            self.click(column + 2, row)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.session], check=False, capture_output=True)


# A notification's left edge (Textual's toast), the only place the run screen draws it.
TOAST_EDGE = "\u258c"
# Shorter than the shipped tiny run (10 steps, longer rollouts), typed as overrides: no path is typed.
QUICK = "eval_every_steps=0 rollout.global_length=64 rollout.max_length_sample=8"


@pytest.mark.timeout(900)
def test_the_newcomers_path_from_the_keyboard(tmp_path):
    env = {
        "TPU_CONSOLE_HOME": str(tmp_path / "home"),  # empty: a fresh clone's first session
        "JAX_PLATFORMS": "cpu",
        "TERM": "xterm-256color",
        "PATH": os.environ.get("PATH", ""),
        "PYTHON": sys.executable,  # the interpreter scripts/console makes .venv with, where it has none
    }
    app = Tmux(f"e2e-{os.getpid()}", "scripts/console", env)
    try:
        app.wait_for("no nodes: press c to create one", timeout=300)  # scripts/console may install first
        app.keys("c")
        app.wait_for("Create a node", "local-2x2")
        app.keys("Enter")  # the defaults as offered: demo, local, local-2x2
        app.wait_for("demo is READY")
        app.wait_for("local-2x2", "READY")

        app.keys("b")
        app.wait_for("bootstrapped 2 worker(s)", timeout=240)
        app.keys("s")
        app.wait_for("Sync the code to demo")
        app.keys("Enter")  # this checkout, as the form offers it
        app.wait_for("synced 2 worker(s)", timeout=120)

        app.keys("l")
        # the tiny config as the value, and its model and data offered (ticked)
        app.wait_for("Launch on demo", "tiny_local.yaml", "Make the tiny model and data")
        app.keys("Tab", "Tab", "Tab")  # past the shipped config, the file path and the job, to the overrides
        app.type(f"steps=3 {QUICK}")
        app.keys("Enter")
        app.wait_for("started on 2 worker(s)", timeout=180)  # the tiny model and data first, then the run
        workers = tmp_path / "home" / "local" / "demo" / "workers"
        for worker in (0, 1):  # made by the form's offer, on each worker's own disk
            assert (workers / str(worker) / "tiny-qwen2" / "config.json").is_file()
            assert (workers / str(worker) / "gsm8k-synthetic.jsonl").is_file()

        app.keys("Enter")  # the node's run, in the dashboard
        shown = app.wait_for("ended: SUCCEEDED", timeout=300)
        assert "2 exited of 2" in shown
        first = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{4}) on demo", shown).group(1)
        for worker in (0, 1):  # the worker grid: exited, at step 3, exit status 0, its step line
            assert re.search(rf"^ {worker}\s+exited\s+3\s+[\d.]+s\s+0\s+step=3 ", shown, re.MULTILINE), shown
        app.press_until("p", "step time (s)", "valid tokens/s", "mean reward")
        app.dismiss_toasts()  # the run's end and the supervisor's word, over the plots' axes
        plots = app.wait_for_line(r"\s*step\s+step\s+step\s*")  # each plot's axis label, drawn
        assert "no steps yet" not in plots and "one step so far" not in plots
        lines = plots.splitlines()
        xlabel = next(i for i, line in enumerate(lines) if re.fullmatch(r"\s*step\s+step\s+step\s*", line))
        ticks = re.findall(r"\d+(?:\.\d+)?", lines[xlabel - 1])
        assert ticks == ["1", "2", "3"] * 3, plots  # whole-number steps on each plot's axis
        app.press_until("Escape", "1 node · updated")  # back on the nodes screen
        app.wait_for("succeeded")  # the node's RUN column

        # A second run, stopped with x once it runs: it reads stopped, not failed.
        app.keys("l")
        app.wait_for("Launch on demo")
        app.keys("Tab", "Tab", "Tab")
        app.type(f"steps=500 {QUICK}")
        app.keys("Enter")
        # the new run's line (the first run's may still be in the panel)
        shown = app.wait_for_line(rf".* run (?!{first})\S+ started on 2 worker\(s\).*", timeout=120)
        second = re.search(rf"run (?!{first})(\S+) started on 2 worker", shown).group(1)
        app.keys("Enter")
        app.wait_for(f"run {second} on demo", "step=1 ", timeout=300)  # its dashboard, the job under way
        app.press_until("x", "Stop run")
        app.keys("y")
        shown = app.wait_for("ended: STOPPED", timeout=120)
        assert "first failure" not in shown and "FAILED" not in shown, shown
        assert len(re.findall(r"^ [01]\s+stopped\s", shown, re.MULTILINE)) == 2, shown
        app.press_until("Escape", "1 node · updated")
        app.wait_for("stopped")  # the node's RUN column

        app.keys("d")
        app.wait_for("Delete local node demo")
        app.type("demo")
        app.keys("Enter")
        app.wait_for("demo deleted", timeout=60)
        app.keys("q")
        print(f"keys pressed again after going unheeded: {app.unheeded or 'none'}")
    finally:
        app.close()
        # A test that failed half-way must not leave its detached jobs running (they are meant to outlive
        # the app): the pod's workers' job groups are stopped.
        pod = tmp_path / "home" / "local" / "demo" / "workers"
        if pod.exists():
            stop_groups([g for w in pod.iterdir() for g in running_job_groups(w)], grace_s=1.0)
