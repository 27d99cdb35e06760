"""The run's supervisor on a local pod with the console gone: `launch` runs in a process of its own, which
is SIGKILLed as soon as it has printed the run id (the local pod's SSH servers die with it, as a laptop
that sleeps takes its connections). What happens next is the supervisor's doing: fail-fast, the node
deleted after the run, the cost budget, a hang, restarts by failure class, and webhook notifications,
whose URL (a secret) shows nowhere. Jobs are bash scripts given as --python; they wait for a `go` file
where the test must look before they act."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.console.launch.test_local import CONFIG, fake_trainer, run, run_folder, worker_home
from tests.console.observe.test_device_metrics import libtpu_server  # noqa: F401 - fixture
from tests.fixtures_cli import console_home, stand_in_tiny_inputs  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console import cli
from tpu_console.locations import home
from tpu_console.providers.local.jobs import running_job_groups, stop_groups
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")

WEBHOOK_SECRET_PATH = "/hooks/T000-B000-very-secret-token"


class Webhook:
    """A Slack-style incoming webhook on 127.0.0.1 that keeps every message it receives."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        received = self.messages

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path == WEBHOOK_SECRET_PATH:
                    received.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{WEBHOOK_SECRET_PATH}"

    def events(self) -> list[str]:
        return [m["event"] for m in self.messages]


@pytest.fixture
def webhook(console_home) -> Iterator[Webhook]:  # noqa: F811
    hook = Webhook()
    console_home.mkdir(parents=True, exist_ok=True)
    (console_home / "config.toml").write_text(f'[notify]\nwebhook_url = "{hook.url}"\n')
    yield hook
    hook.server.shutdown()


@pytest.fixture
def pod2(capsys) -> Iterator[str]:
    assert cli.main(["create", "pod", "--type", "local-2x1"]) == 0
    capsys.readouterr()
    stand_in_tiny_inputs(worker_home(w) for w in range(2))  # the fake trainers read neither
    yield "pod"
    # A test that failed half-way must not leave detached jobs or supervisors running after it.
    for worker in range(2):
        runs = worker_home(worker) / "tpu-console" / "runs"
        stop_groups(running_job_groups(worker_home(worker)), grace_s=1.0)
        for pid_file in runs.glob("*/supervisor.pid") if runs.exists() else ():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)


def launch_then_kill_console(python: str, *flags: str) -> tuple[str, str]:
    """`tpu-console launch` in a process of its own, SIGKILLed once it printed the run id; (run id, all
    it printed)."""
    console = subprocess.Popen(
        [sys.executable, "-m", "tpu_console", "launch", "pod", "--config", str(CONFIG), "--python", python,
         "--no-plan-check", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    run_id = console.stdout.readline().strip()
    console.send_signal(signal.SIGKILL)
    out, err = console.communicate()
    assert run_id and console.returncode == -signal.SIGKILL, err
    return run_id, run_id + out + err


def decisions(run_id: str) -> list[dict]:
    path = run_folder(0, run_id) / "supervisor.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def decided(run_id: str, name: str) -> bool:
    return any(d["decision"] == name for d in decisions(run_id))


def exit_status(run_id: str, worker: int) -> str:
    """The worker's `exit` file, once written: the wrapper writes it after the runner is told it is done, so
    it can follow the supervisor's "ended" decision by a moment on a busy machine."""
    path = run_folder(worker, run_id) / "exit"
    wait_for(path.exists, timeout=15)
    return path.read_text().strip()


def node_dir() -> Path:
    return home() / "local" / "pod"


def go(tmp_path: Path) -> None:
    (tmp_path / "go").touch()


def wait_go(tmp_path: Path) -> str:
    return f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n"


def command_lines() -> str:
    lines = []
    for proc in Path("/proc").iterdir():
        try:
            lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(lines)


def test_fail_fast_with_the_console_gone_and_the_webhook_url_nowhere(capsys, pod2, tmp_path, webhook):
    job = fake_trainer(tmp_path, wait_go(tmp_path) + (
        'if [ "$TRAINER_PROCESS_ID" = 1 ]; then echo boom; exit 1; fi\n'
        "while true; do sleep 0.1; done\n"))
    run_id, printed = launch_then_kill_console(job, "--fail-fast")
    # the URL reached the supervisor's worker only, as a 0600 file, and no command line
    notify = run_folder(0, run_id) / ".notify"
    assert oct(notify.stat().st_mode & 0o777) == "0o600" and not (run_folder(1, run_id) / ".notify").exists()
    assert WEBHOOK_SECRET_PATH not in command_lines()
    go(tmp_path)

    wait_for(lambda: decided(run_id, "ended"), timeout=45)
    assert exit_status(run_id, 0) == "143"  # stopped by the supervisor
    assert exit_status(run_id, 1) == "1"
    messages = [d["message"] for d in decisions(run_id)]
    assert "worker 1 exited 1: stopping worker(s) 0 (they would wait in a collective)" in messages
    wait_for(lambda: webhook.events() == ["failed"], timeout=30)
    assert "worker 1 exited 1" in webhook.messages[0]["text"] and run_id in webhook.messages[0]["text"]

    status, out, err = run(capsys, "status", run_id)
    assert status == 0 and "supervisor: the run failed" in out
    for text in (printed, out, err, *(p.read_text() for p in run_folder(0, run_id).iterdir()
                                      if p.is_file() and p.name != ".notify")):
        assert WEBHOOK_SECRET_PATH not in text
    assert webhook.events() == ["failed"]  # once, and the console sent no copy of its own


def test_the_node_is_deleted_a_grace_after_the_run_ends(pod2, tmp_path, webhook):
    job = fake_trainer(tmp_path, wait_go(tmp_path) + "echo done\n")
    run_id, _ = launch_then_kill_console(job, "--on-end", "delete", "--grace", "1s")
    go(tmp_path)
    wait_for(lambda: decided(run_id, "delete-scheduled"), timeout=30)
    assert node_dir().exists()  # not before the grace
    wait_for(lambda: not node_dir().exists(), timeout=30)
    wait_for(lambda: sorted(webhook.events()) == ["deleted", "succeeded"], timeout=15)


def test_max_cost_stops_the_run_with_sigterm_then_deletes_the_node(pod2, tmp_path):
    mark = tmp_path / "checkpointed"
    job = fake_trainer(tmp_path, (
        f"trap 'echo $TRAINER_PROCESS_ID >> {mark}; exit 143' TERM\n"
        "while true; do sleep 0.1; done\n"))
    # $36/h is a cent a second: a budget of 8 cents lasts about eight seconds from the launch, time for a
    # busy machine to start both jobs and for each to set its trap
    launch_then_kill_console(job, "--max-cost", "0.08", "--price-per-hour", "36")
    wait_for(lambda: not node_dir().exists(), timeout=45)
    assert sorted(mark.read_text().split()) == ["0", "1"]  # each job had its SIGTERM (time to checkpoint)


def test_max_hang_deletes_a_node_whose_workers_stopped_stepping(pod2, tmp_path, webhook):
    job = fake_trainer(tmp_path, (
        """echo '{"t": 1, "kind": "step", "process": 0, "step": 1}' >> events.jsonl\n"""
        "sleep 1000\n"))
    run_id, _ = launch_then_kill_console(job, "--max-hang", "3s")
    wait_for(lambda: decided(run_id, "max-hang") or not node_dir().exists(), timeout=45)
    wait_for(lambda: not node_dir().exists(), timeout=30)
    wait_for(lambda: "deleted" in webhook.events(), timeout=15)
    hung = [m["text"] for m in webhook.messages if m["event"] == "hung"]
    assert len(hung) == 1 and "no worker made a step for 3s" in hung[0]


def test_a_transient_failure_restarts_every_job_and_an_oom_is_never_restarted(
        capsys, pod2, tmp_path, webhook):
    # Worker 1 times out in jax.distributed on its first attempt only; the others wait for it.
    flaky = fake_trainer(tmp_path, (
        'if [ "$TRAINER_PROCESS_ID" = 1 ] && [ ! -e attempted ]; then touch attempted; '
        "echo 'jax.distributed.initialize() failed: DEADLINE_EXCEEDED: Barrier timed out'; exit 1; fi\n"
        "sleep 1; echo finished\n"))
    run_id, _ = launch_then_kill_console(flaky, "--restart-on", "transient", "--max-restarts", "2")
    wait_for(lambda: decided(run_id, "ended"), timeout=60)
    names = [d["decision"] for d in decisions(run_id)]
    ended = next(d for d in decisions(run_id) if d["decision"] == "ended")
    assert names.count("restart") == 1 and ended["outcome"] == "succeeded"
    restart = next(d for d in decisions(run_id) if d["decision"] == "restart")
    assert restart["cause"] == "distributed_timeout" and "restart 1 of 2" in restart["message"]
    for worker in (0, 1):
        assert exit_status(run_id, worker) == "0"
        assert "starting worker" in (run_folder(worker, run_id) / "output.log").read_text()
    status, out, _ = run(capsys, "runs", "show", run_id)
    assert status == 0 and "restart 1 of 2" in out  # the restart is in the run's history
    wait_for(lambda: webhook.events() == ["restarted", "succeeded"], timeout=15)  # each once

    (tmp_path / "fake-python").unlink()
    oom = fake_trainer(tmp_path, (
        'if [ "$TRAINER_PROCESS_ID" = 1 ]; then echo "RESOURCE_EXHAUSTED: Out of memory while trying to '
        'allocate 1.2G"; exit 1; fi\n'
        "while true; do sleep 0.1; done\n"))
    run_id, printed = launch_then_kill_console(oom, "--restart-on", "transient")
    try:
        wait_for(lambda: decided(run_id, "ended"), timeout=20)
    except AssertionError:
        for w in (0, 1):
            for p in run_folder(w, run_id).iterdir():
                if p.suffix in (".log", ".jsonl", "") and p.is_file():
                    print(w, p.name, p.read_text()[-2000:])
        print(printed)
        raise
    names = [d["decision"] for d in decisions(run_id)]
    assert "restart" not in names and "stop-others" in names
    assert any("a oom failure is never restarted" in d["message"] for d in decisions(run_id))


STUCK_JOB = """\
import faulthandler, signal, threading, time
faulthandler.register(signal.SIGUSR1, file=open("stacks.txt", "a"), all_threads=True)
open("ready", "w").close()
def all_reduce():
    threading.Event().wait()
all_reduce()
"""


def test_stacks_names_a_worker_that_does_not_answer_and_shows_the_other(
        capsys, pod2, tmp_path, libtpu_server):  # noqa: F811 - a fixture
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_JOB)
    job = fake_trainer(tmp_path, f"exec {sys.executable} {script}\n")
    status, out, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", job,
                           "--no-plan-check")
    assert status == 0, err
    run_id = out.strip()
    wait_for(lambda: all((run_folder(w, run_id) / "ready").exists() for w in (0, 1)))
    pids = {w: int((run_folder(w, run_id) / "job.pid").read_text()) for w in (0, 1)}
    os.kill(pids[1], signal.SIGSTOP)
    try:
        status, out, _ = run(capsys, "stacks", "pod", "--wait", "2", "--json")
        assert status == 0
        found = json.loads(out)
        assert found["silent"] == [{"worker": 1, "why": "its job is stopped (SIGSTOP)"}]
        (group,) = found["groups"]
        assert group["workers"] == [0] and group["where"].startswith("stuck.py:5 (all_reduce), inside ")
        assert 'in all_reduce' in group["stack"]
        # a CPU pod's libtpu says nothing: said so, never numbers
        assert all(w["devices"] == [] and "no libtpu metrics" in w["not_reported"] for w in found["libtpu"])
        status, out, _ = run(capsys, "stacks", "pod", "--wait", "1", "--address", libtpu_server)
        assert f"{run_id} on pod: worker 0: stuck.py:5 (all_reduce), inside threading.py:" in out
        assert "; worker 1: did not answer (its job is stopped (SIGSTOP))" in out
        # beside the stacks, libtpu's view of the chips (both workers see the one stand-in here)
        assert ("libtpu: worker 0: TensorCores 12-88% busy, idle up to 412s; "
                "worker 1: TensorCores 12-88% busy, idle up to 412s") in out
    finally:
        os.kill(pids[1], signal.SIGCONT)
        run(capsys, "stop", "pod", "--yes", "--grace", "1")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--restart-on", "oom"], "a oom failure fails the same way again and is never restarted"),
        (["--restart-on", "cosmic_rays"], "is not a failure class"),
        (["--max-hang", "soon"], "--max-hang 'soon' is not a duration"),
        (["--max-cost", "5"], "--max-cost needs the node's price"),
        (["--max-cost", "lots"], "--max-cost 'lots' is not an amount"),
        (["--grace", "5m"], "add --on-end delete"),
        (["--max-restarts", "5"], "add --restart-on transient"),
    ],
)
def test_bad_supervision_flags_are_one_line_and_start_nothing(capsys, pod2, flags, message):
    status, _, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", "true", *flags)
    assert status == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (home() / "local" / "pod" / "workers" / "0" / "tpu-console").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_real_trainer_is_restarted_from_its_checkpoint_after_a_distributed_timeout(
    capsys, tmp_path, tiny_model_dir
):
    """The trainer (tiny model, CPU) fails with an injected jax.distributed timeout right after step 1's
    checkpoint; the supervisor starts it again, and it resumes from step 1 and ends at step 2."""
    assert cli.main(["create", "pod", "--type", "local-1x1"]) == 0
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    env = tmp_path / "faults.env"
    # With the compilation cache on, as it is by default on a TPU VM (trainer/compilation_cache.py): the
    # restarted job loads the programs the first one compiled instead of compiling them again.
    env.write_text(
        f"TRAINER_FAULT_DISTRIBUTED_TIMEOUT_AFTER_STEP=1\nTRAINER_COMPILATION_CACHE={tmp_path}/jax-cache\n"
    )
    sets = [f"model_path={tiny_model_dir}", f"data.path={data}", "steps=2", "eval_every_steps=0",
            "rollout.global_length=64", "rollout.max_length_sample=8", f"checkpoint.dir={tmp_path}/ckpt",
            "checkpoint.every_steps=1"]
    run_id, _ = launch_then_kill_console(
        sys.executable, "--env-file", str(env), "--restart-on", "transient",
        *(arg for value in sets for arg in ("--set", value)),
    )
    wait_for(lambda: decided(run_id, "ended"), timeout=240, poll=0.5)
    made = decisions(run_id)
    log = (run_folder(0, run_id) / "output.log").read_text()
    assert made[-1]["outcome"] == "succeeded", log[-3000:]
    (restart,) = [d for d in made if d["decision"] == "restart"]
    assert restart["cause"] == "distributed_timeout"
    assert "DEADLINE_EXCEEDED" in log and "resumed from checkpoint step 1" in log
    events = [json.loads(line) for line in (run_folder(0, run_id) / "events.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps == [1, 2]  # step 2 once, after the resume; step 1 not run again
