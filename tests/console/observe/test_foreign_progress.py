"""Progress of a program that knows nothing of tpu-console, launched with `launch -- CMD` on a local pod: its
step lines (the seeds' format on worker 0, MaxText's on worker 1, both behind a logger's prefix) reach
`status`, `runs show`, the run feed and the Steps tab's breakdown with their phases; a job file's regex
is used; a new user's loop is read with nothing set, and `launch --metrics` overrides the format; a
program whose lines match nothing says so."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from tests.absent import PTRACE_FIX, absent
from tests.console.launch.test_local import pod, run, run_folder  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.history.store import RunStore
from tpu_console.providers.local import LocalProvider
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.widgets.step_breakdown import breakdown
from trainer import telemetry as tm

pytestmark = pytest.mark.usefixtures("console_home", "pod")

# Written into the test's folder and run by path: nothing of this project is imported.
FOREIGN = """\
import os, sys, time
worker = int(os.environ["TPU_CONSOLE_WORKER"])


def wait_for_the_others():
    while True:
        time.sleep(0.05)


if sys.argv[1] == "wait":
    wait_for_the_others()
print("loading the model", flush=True)
for step in range(1, 4):
    time.sleep(0.15)
    if sys.argv[1] == "mixed" and worker == 0:
        print(f"2026-01-24 10:57:31 [rank0] INFO step={step} loss={1.0 / step:.4f} entropy=1.5 "
              f"reward_mean=0.5 dt=0.30s rollout_generate=0.20s update=0.08s data_wait=0.02s", flush=True)
    elif sys.argv[1] == "mixed":
        print(f"I0804 08:14:00.000000 1 metric_logger.py:196] completed step: {step}, seconds: 0.250, "
              f"TFLOP/s/device: 1.5, Tokens/s/device: 100.0, loss: 0.5", flush=True)
    elif sys.argv[1] == "metrics":  # tunix-like: TensorBoard files and W&B's summary, no step line
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        writer = EventFileWriter("tb/train")
        values = [summary_pb2.Summary.Value(tag="loss", simple_value=1.0 / step),
                  summary_pb2.Summary.Value(tag="perf/step_time_seconds", simple_value=0.5)]
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                         summary=summary_pb2.Summary(value=values)))
        writer.close()
        os.makedirs("wandb/latest-run/files", exist_ok=True)  # as wandb leaves it in the job's folder
        with open("wandb/latest-run/files/wandb-summary.json", "w") as f:
            f.write('{"throughput/train/valid_tokens_per_s": %d, "time/train/step_avg_last10_s": 0.5, '
                    '"memory/train/peak_bytes_in_use_max_gib": 27.5}' % (4000 + 100 * worker))
    elif sys.argv[1] == "regex":
        print(f"[trainer] iter {step} | loss {2.0 / step:.3f} | fwd_bwd 0.125s", flush=True)
    elif sys.argv[1] == "loop":  # the first loop a new user writes
        print(f"step {step} | loss {1.0 / step:.4f} | 0.15 s/step", flush=True)
    else:
        print(f"working on something ({step})", flush=True)
"""


def foreign(tmp_path: Path) -> str:
    path = tmp_path / "foreign_progress.py"
    path.write_text(FOREIGN)
    return str(path)


def launch(capsys, *argv: str) -> str:
    status, out, err = run(capsys, "launch", "pod", "--json", *argv)
    assert status == 0, err
    return json.loads(out)["run_id"]


def ended_status(capsys, run_id: str) -> dict:
    status, out, err = run(capsys, "logs", run_id, "--follow")  # until every job has ended
    assert status == 0, out + err
    status, out, err = run(capsys, "status", run_id, "--json")
    assert status == 0, err
    return json.loads(out)


def followed_to_its_end(run_id: str) -> tuple[RunFeed, dict[int, list]]:
    """The app's feed of the run, followed until it ended (the watch keeps its archive and summary), and
    the steps each worker's messages brought."""
    posted = []
    provider = LocalProvider()  # the pod the CLI made, from the same console home
    feed = RunFeed({"local": provider}, run_id, RunStore(), poll_s=0.1, devices_every_s=60)

    async def follow() -> None:
        try:
            await feed.follow(posted.append)
        finally:
            await provider.close()

    asyncio.run(follow())
    arrived: dict[int, list] = {}
    for message in posted:
        if type(message).__name__ == "RunStepsArrived":
            for worker, steps in message.by_worker.items():
                arrived.setdefault(worker, []).extend(steps)
    return feed, arrived


def test_seeds_and_maxtext_steps_reach_status_runs_show_and_the_run_feed(capsys, tmp_path):
    run_id = launch(capsys, "--", sys.executable, foreign(tmp_path), "mixed")
    document = ended_status(capsys, run_id)
    steps = {w["worker"]: w for w in document["worker_status"]}
    assert document["steps_source"] == "steps: from output.log (maxtext, seeds format)"
    events = {w: [json.loads(line) for line in (run_folder(w, run_id) / "events.jsonl").open()]
              for w in (0, 1)}
    assert [e["step"] for e in events[0]] == [1, 2, 3] and [e["step"] for e in events[1]] == [1, 2, 3]
    assert events[0][-1][tm.phase_key("rollout_generate")] == 0.2 and events[0][-1]["format"] == "seeds"
    assert events[1][-1][tm.phase_key("step")] == 0.25 and events[1][-1]["format"] == "maxtext"
    assert steps[0] and steps[1]  # each worker in the table

    status, out, err = run(capsys, "status", run_id)
    assert status == 0, err
    table = out.splitlines()
    assert any(line.startswith("[0]") and " 3 " in line and "0.30" in line for line in table), out
    assert any(line.startswith("[1]") and " 3 " in line and "0.25" in line for line in table), out
    assert "steps: from output.log (maxtext, seeds format)" in out

    status, out, err = run(capsys, "runs", "show", run_id)
    assert status == 0, err
    step_time = next(line for line in out.splitlines() if line.startswith("step time, avg of last 10 (s)"))
    assert step_time.split()[-1] == "0.3"
    assert "steps: from output.log (maxtext, seeds format)" in out


def test_the_run_feed_and_the_steps_tab_show_a_foreign_programs_phases(capsys, tmp_path):
    run_id = launch(capsys, "--", sys.executable, foreign(tmp_path), "mixed")
    feed, arrived = followed_to_its_end(run_id)
    assert [s.step for s in arrived[0]] == [1, 2, 3] and [s.step for s in arrived[1]] == [1, 2, 3]
    latest = {w: steps[-1] for w, steps in arrived.items()}
    assert latest[0].phases == {"rollout_generate": 0.2, "update": 0.08, "data_wait": 0.02}
    snapshot = feed.snapshot()
    assert snapshot.steps_note == "steps: from output.log (maxtext, seeds format)"
    rendered = _text(breakdown(latest, 0, {}, snapshot.steps_note))
    for phase in ("rollout_generate", "update", "data_wait", "step"):
        assert phase in rendered
    assert rendered.index("\nupdate") < rendered.index("\ndata_wait") < rendered.index("\nstep ")


def test_a_job_files_regex_and_a_program_that_matches_nothing(capsys, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        f'command = ["{sys.executable}", "{foreign(tmp_path)}", "regex"]\n[metrics]\nformat = "regex"\n'
        r"regex = 'iter (?P<step>\d+) \| loss (?P<loss>[\d.]+) \| fwd_bwd (?P<fwd_bwd_s>[\d.]+)s'" "\n"
    )
    run_id = launch(capsys, "--job", str(job))
    document = ended_status(capsys, run_id)
    assert document["steps_source"] == "steps: from output.log (regex format)"
    last = json.loads((run_folder(1, run_id) / "events.jsonl").read_text().splitlines()[-1])
    assert (last["step"], last[tm.LOSS], last[tm.phase_key("fwd_bwd")]) == (3, 0.667, 0.125)

    run_id = launch(capsys, "--", sys.executable, foreign(tmp_path), "silent")
    document = ended_status(capsys, run_id)
    said = "steps: no step line was recognised in the output (auto: seeds, "
    assert document["steps_source"].startswith(said)
    assert "--metrics 'REGEX'" in document["steps_source"]  # ended: no "yet", and how to give the line
    assert not (run_folder(0, run_id) / "events.jsonl").exists()


def test_a_new_users_loop_is_read_with_nothing_set_and_launch_metrics_overrides_it(capsys, tmp_path):
    run_id = launch(capsys, "--", sys.executable, foreign(tmp_path), "loop")
    document = ended_status(capsys, run_id)
    assert document["steps_source"] == "steps: from output.log (loop format)"
    events = [json.loads(line) for line in (run_folder(0, run_id) / "events.jsonl").open()]
    assert [e["step"] for e in events] == [1, 2, 3]
    assert (events[-1][tm.LOSS], events[-1][tm.phase_key("step")]) == (0.3333, 0.15)

    regex = r"step (?P<step>\d+) \| loss (?P<loss>[\d.]+)"  # the loss alone: the step time from arrivals
    run_id = launch(capsys, "--metrics", regex, "--", sys.executable, foreign(tmp_path), "loop")
    document = ended_status(capsys, run_id)
    assert document["steps_source"] == "steps: from output.log (regex format)"
    assert json.loads((run_folder(0, run_id) / "launch.json").read_text())["job"]["metrics"]["regex"] == regex
    events = [json.loads(line) for line in (run_folder(0, run_id) / "events.jsonl").open()]
    assert [e["step"] for e in events] == [1, 2, 3] and events[-1][tm.LOSS] == 0.3333
    assert tm.phase_key("step") not in events[0]  # the first step's line alone says nothing of its time

    for given, says in [("step (\\d+", "is neither a format"), ("step (\\d+)", "no named group `step`"),
                        ("regex", "give the regular expression itself")]:
        status, _, err = run(capsys, "launch", "pod", "--metrics", given, "--", sys.executable, "x.py")
        assert status == 2 and err.startswith("error: ") and says in err and err.count("\n") == 1, err
    status, _, err = run(capsys, "launch", "pod", "--metrics", "tqdm", "--config", "x.yaml")
    assert status == 2 and "the trainer (--config) writes its own" in err, err


def _text(renderable) -> str:
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(renderable)
    return console.export_text()


def test_stacks_of_a_foreign_python_program_come_from_py_spy(capsys, tmp_path):
    run_id = launch(capsys, "--", sys.executable, foreign(tmp_path), "wait")
    try:
        for _ in range(20):  # until the interpreter has reached its loop on every worker
            status, out, err = run(capsys, "stacks", run_id, "--json")
            found = json.loads(out)
            if [g["workers"] for g in found["groups"]] == [[0, 1]] and "wait_for_the_others" in out:
                break
            if any("ptrace" in s["why"] or "ermission" in s["why"] for s in found["silent"]):
                absent(f"py-spy cannot attach here: {found['silent']}", PTRACE_FIX)
            time.sleep(0.25)
        assert status == 0, err
        assert found["groups"][0]["where"].startswith("foreign_progress.py:"), found
        assert found["groups"][0]["where"].endswith("(wait_for_the_others)"), found
        assert not (run_folder(0, run_id) / "stacks.txt").exists()  # no SIGUSR1: py-spy read it
    finally:
        stopped = run(capsys, "stop", run_id, "--yes")
        assert stopped[0] == 0, stopped


def test_tensorboard_steps_reach_the_dashboard_and_wandb_fills_the_summary_kept(capsys, tmp_path):
    job = tmp_path / "tunix.toml"
    job.write_text(f'command = ["{sys.executable}", "{foreign(tmp_path)}", "metrics"]\n'
                   '[metrics]\nformat = "none"\ntensorboard = "tb"\n')
    first = launch(capsys, "--job", str(job))
    feed, arrived = followed_to_its_end(first)
    assert sorted(arrived) == [0, 1]
    assert [s.step for s in arrived[0]] == [1, 2, 3]  # every event file's step, each once
    assert (arrived[0][-1].step_s, arrived[0][-1].loss) == (0.5, pytest.approx(1 / 3))
    assert feed.snapshot().steps_note.startswith("steps: from TensorBoard event files in tpu-console/runs/")

    second = launch(capsys, "--", sys.executable, foreign(tmp_path), "mixed")
    ended_status(capsys, second)
    status, out, err = run(capsys, "runs", "show", first, "--json")
    assert status == 0, err
    summary = json.loads(out)["summary"]
    assert summary[tm.VALID_TOKENS_PER_S] == 4000  # the slower worker's, as for the trainer
    assert summary[tm.MEM_PEAK] == 27.5 and summary[tm.STEP_AVG_LAST10] == 0.5
    status, out, err = run(capsys, "runs", "compare", first, second)
    assert status == 0, err
    tokens = next(line for line in out.splitlines() if line.startswith("valid tokens/s"))
    assert tokens.split()[2:4] == ["4,000", "-"], out
