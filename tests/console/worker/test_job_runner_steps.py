"""The job runner reads a command job's step lines into events.jsonl (worker/job_runner.py, step_lines.py):
the runner runs as on a worker, from a run folder holding its shipped files, against a stand-in supervisor
that records the heartbeats, and the job is a foreign Python script that knows nothing of tpu-console."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tpu_console.fleet.run_recipes import RUNNER_MODULES
from tpu_console.observe import signatures, supervision
from tpu_console.worker import HERE as WORKER_DIR
from tpu_console.worker import job_runner
from trainer import telemetry as tm

FOREIGN = """\
import sys, time
print("loading the model", flush=True)
for step in range(1, 4):
    time.sleep(0.3)
    sys.stdout.write(f"\\rbatch {step}/3 [{'#' * step}]\\r")  # a progress bar, redrawn with \\r
    print(f"I0804 08:14:00.000000 1 train.py:9] step={step} loss={1.0 / step:.4f} entropy=1.5 "
          f"reward_mean=0.5 dt=0.30s rollout_generate=0.20s update=0.10s", flush=True)
sys.stdout.write("step=4 loss=0.2 dt=0.30s")  # the last line, unterminated: read once the job ended
sys.exit(int(sys.argv[1]))
"""


class StandInSupervisor:
    """Answers every report (`done` once the job exited) and keeps the heartbeats."""

    def __init__(self) -> None:
        self.reports: list[dict] = []
        reports = self.reports

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                report = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reports.append(report)
                body = json.dumps({"order": "done" if report["event"] in ("exit", "poll") else "go"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def stand_in() -> Iterator[StandInSupervisor]:
    supervisor = StandInSupervisor()
    yield supervisor
    supervisor.server.shutdown()


def run_folder(tmp_path: Path, job: dict | None) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    # as launch ships them (fleet/run_recipes.py)
    for name in RUNNER_MODULES:
        shutil.copy(WORKER_DIR / name, folder / name)
    (folder / "launch.json").write_text(json.dumps({"worker": 1, "job": job}))
    plan = {"heartbeat_s": 0.2, "signatures": signatures.patterns()}  # as observe/supervision.py plans it
    (folder / supervision.PLAN_FILE).write_text(json.dumps(plan))
    (folder / "foreign.py").write_text(FOREIGN)
    (folder / "output.log").write_text("an earlier attempt's step=99 loss=1 dt=1s\n")
    return folder


def run_job(folder: Path, stand_in: StandInSupervisor, status: int = 0) -> int:
    with (folder / "output.log").open("ab") as log:  # as the job wrapper does: the job's output appended
        return subprocess.run(
            [sys.executable, "job_runner.py", "--", sys.executable, "-u", "foreign.py", str(status)],
            cwd=folder, stdout=log, stderr=subprocess.STDOUT, timeout=60,
            env={"PATH": "/usr/bin:/bin", supervision.ADDRESS_ENV: stand_in.address},
        ).returncode


def test_a_command_jobs_step_lines_become_step_events_and_heartbeats(tmp_path, stand_in):
    job = {"kind": "command", "command": ["python", "foreign.py"], "metrics": {"format": "auto"}}
    folder = run_folder(tmp_path, job)
    assert run_job(folder, stand_in, status=3) == 3
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2, 3, 4]  # not the earlier attempt's line
    first = events[0]
    assert first["kind"] == "step" and first["process"] == 1
    assert (first["source"], first["format"]) == ("output.log", "seeds")
    assert first[tm.phase_key("step")] == 0.3 and first[tm.phase_key("rollout_generate")] == 0.2
    assert first[tm.LOSS] == 1.0 and first[tm.REWARD_MEAN] == 0.5 and first[tm.STEP_AVG_LAST10] == 0.3
    beats = [r for r in stand_in.reports if r["event"] == "heartbeat" and r.get("step")]
    assert beats and beats[-1]["step_s"] == pytest.approx(0.3)  # what the stall judgement scales with
    exit_report = next(r for r in stand_in.reports if r["event"] == "exit")
    assert exit_report["status"] == 3 and exit_report["worker"] == 1


@pytest.mark.parametrize(
    "job", [None, {"kind": "command", "metrics": {"format": "none"}}]  # None: the trainer, an older run
)
def test_the_trainer_and_format_none_get_no_parsed_steps(tmp_path, stand_in, job):
    folder = run_folder(tmp_path, job)
    (folder / "foreign.py").write_text("print('step=1 loss=0.5 dt=0.1s', flush=True)\n")
    assert run_job(folder, stand_in) == 0
    assert not (folder / "events.jsonl").exists()


@pytest.mark.parametrize(
    ("job", "prints", "status", "cause"),
    [
        ({"kind": "command"}, "jax.distributed.initialize() failed: DEADLINE_EXCEEDED", 1,
         "distributed_timeout"),
        ({"kind": "command"}, "Traceback (most recent call last):\n  File x\nValueError: bad", 1,
         "exception"),
        ({"kind": "command"}, "usage: train.py [-h]", 2, None),  # exit 2 of any program is no config class
        (None, "error: config refused", 2, "config"),  # the trainer's refused config
    ],
)
def test_a_failures_class_comes_from_the_log_alone(tmp_path, stand_in, job, prints, status, cause):
    folder = run_folder(tmp_path, job)
    program = f"import sys\nprint({prints!r}, flush=True)\nsys.exit(int(sys.argv[1]))\n"
    (folder / "foreign.py").write_text(program)
    assert run_job(folder, stand_in, status=status) == status
    exit_report = next(r for r in stand_in.reports if r["event"] == "exit")
    assert (exit_report["status"], exit_report["cause"]) == (status, cause)


BAR = """\
import sys, time
def draw(n, tail="]"):
    sys.stdout.write(f"\\r{100 * n // 6:3d}%|{'#' * n:6s}| {n}/6 [00:0{n}<00:0{6 - n}, 5.00it/s{tail}")
    sys.stdout.flush()
draw(0, "]")
for n in range(1, 7):
    time.sleep(0.15)
    sys.stdout.write(f"\\r{100 * n // 6:3d}%|{'#' * n:6s}| {n}/6 [00:0")  # half a redraw: the runner waits
    sys.stdout.flush()
    time.sleep(0.6 if n == 3 else 0.05)
    sys.stdout.write(f"{n}<00:0{6 - n}, 5.00it/s, loss={1 / n:.3f}]")
    if n != 3:  # step 3 is drawn only in two halves
        draw(n, f", loss={1 / n:.3f}]")  # the same step drawn again
    sys.stdout.write("\\x08" * 3 + "\\r")  # and rubbed out, as Keras does
print()
"""


def test_a_bar_redrawn_with_carriage_returns_and_backspaces_counts_each_step_once(tmp_path, stand_in):
    job = {"kind": "command", "command": ["python", "foreign.py"], "metrics": {"format": "auto"}}
    folder = run_folder(tmp_path, job)
    (folder / "foreign.py").write_text(BAR)
    assert run_job(folder, stand_in) == 0
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5, 6]  # the last one once the job ended
    assert all(e["format"] == "tqdm" and e[tm.phase_key("step")] == 0.2 for e in events)
    assert [e[tm.LOSS] for e in events] == [1.0, 0.5, 0.333, 0.25, 0.2, 0.167]


def test_a_program_that_prints_no_step_time_gets_the_time_between_its_step_lines(tmp_path, stand_in):
    job = {"kind": "command", "command": ["python", "foreign.py"], "metrics": {"format": "auto"}}
    folder = run_folder(tmp_path, job)
    (folder / "foreign.py").write_text(
        "import time\nfor step in range(1, 9):\n    time.sleep(0.25)\n"
        "    print(f'Step {step}/8, loss={1 / step:.3f}, lr=1e-3', flush=True)\n")
    assert run_job(folder, stand_in) == 0
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == list(range(1, 9)) and tm.phase_key("step") not in events[0]
    # read every 0.1 s: over the last seven steps' 1.75 s, within a read or two
    assert events[-1][tm.phase_key("step")] == pytest.approx(0.25, rel=0.2)


def test_a_program_whose_lines_give_their_own_time_is_timed_by_it(tmp_path, stand_in):
    job = {"kind": "command", "command": ["python", "foreign.py"], "metrics": {"format": "auto"}}
    folder = run_folder(tmp_path, job)
    (folder / "foreign.py").write_text(  # absl's prefix, two seconds apart, printed at once (as tunix's)
        "for step in range(1, 6):\n"
        "    print(f'I1127 21:44:{2 * step:02d}.250000 140 peft_trainer.py:488] Train step {step} training "
        "loss: {1 / step:.3f}')\n")
    assert run_job(folder, stand_in) == 0
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5]
    assert [e.get(tm.phase_key("step")) for e in events] == [None, 2.0, 2.0, 2.0, 2.0]


# Rich's live display with the columns of Lightning's bar, refreshed once a step, as in a terminal.
RICH_BAR = """\
import time
from rich.progress import BarColumn, Progress, TextColumn
columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
           TextColumn("0:00:00 • 0:00:01"), TextColumn("4.00it/s"),
           TextColumn("train_loss: {task.fields[loss]}"))
with Progress(*columns, auto_refresh=False) as progress:
    task = progress.add_task("Epoch 0/0", total=4, loss="nan")
    for n in range(1, 5):
        time.sleep(0.25)
        progress.update(task, completed=n, loss=f"{1 / n:.3f}", refresh=True)
"""


def test_rich_redraws_its_live_display_under_the_runner_and_each_step_is_read_as_it_comes(tmp_path, stand_in):
    job = {"kind": "command", "command": ["python", "foreign.py"], "metrics": {"format": "auto"}}
    folder = run_folder(tmp_path, job)
    (folder / "foreign.py").write_text(RICH_BAR)
    assert run_job(folder, stand_in) == 0
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    # into a file, Rich would draw once, at its end (step 4 alone): the job's TERMINAL_ENV has it redraw
    assert [(e["step"], e[tm.LOSS]) for e in events] == [(1, 1.0), (2, 0.5), (3, 0.333), (4, 0.25)]
    assert events[-1]["t"] - events[0]["t"] > 0.4  # each read while the job ran
    assert all(e[tm.phase_key("step")] == 0.25 for e in events)


def test_a_jobs_own_setting_of_the_terminal_env_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = job_runner.Runner(["true"], {}, 0, None, env={"TTY_INTERACTIVE": "0", "PATH": "/bin"})
    assert runner.env == {**job_runner.TERMINAL_ENV, "TTY_INTERACTIVE": "0", "PATH": "/bin"}
