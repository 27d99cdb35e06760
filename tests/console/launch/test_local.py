"""The launch workflow end to end through the CLI, on a local pod, with a fake trainer (a bash script given
as --python): launch on every worker, per-worker exit codes, logs --follow, stop, secrets, validation."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_cli import console_home, stand_in_tiny_inputs  # noqa: F401 - fixture
from tests.processes import pid_alive, wait_for
from tpu_console import cli
from tpu_console.locations import database_file, home

pytestmark = pytest.mark.usefixtures("console_home")

SECRET = "hunter2-s3cr3t-do-not-leak"
CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"

# Writes a step event, fails on process 1 with an error event, succeeds elsewhere.
FAILING_ON_1 = """\
echo "worker process $TRAINER_PROCESS_ID of $TRAINER_NUM_PROCESSES require=$TRAINER_REQUIRE_PROCESS_COUNT"
echo '{"t": 1, "kind": "step", "process": '$TRAINER_PROCESS_ID', "step": 1, "time/train/step_s": 0.25}' >> events.jsonl
for i in 1 2 3; do echo "line $i"; sleep 0.2; done
if [ "$TRAINER_PROCESS_ID" = 1 ]; then
  echo '{"t": 2, "kind": "error", "process": 1, "message": "boom on 1"}' >> events.jsonl
  echo "dying" >&2; exit 3
fi
echo '{"t": 3, "kind": "end", "process": 0, "status": "ok"}' >> events.jsonl
"""  # noqa: E501 - an event line of the fake trainer

# Proves it got the secret without printing it, starts a child in its group, then waits to be stopped.
LONG_RUNNING = f"""\
[ "$MY_SECRET" = '{SECRET}' ] && echo secret-ok
sleep 300 & echo $! > child.pid
while true; do sleep 0.1; done
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def fake_trainer(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-python"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return str(path)


def worker_home(worker: int, node: str = "pod") -> Path:
    return home() / "local" / node / "workers" / str(worker)


def run_folder(worker: int, run_id: str) -> Path:
    return worker_home(worker) / "tpu-console" / "runs" / run_id


@pytest.fixture
def pod(capsys) -> str:
    assert cli.main(["create", "pod", "--type", "local-2x1"]) == 0
    capsys.readouterr()
    stand_in_tiny_inputs(worker_home(w) for w in range(2))
    return "pod"


def launch(capsys, python: str, *extra: str) -> str:
    status, out, err = run(
        capsys, "launch", "pod", "--config", str(CONFIG), "--python", python, *extra, "--json"
    )
    assert status == 0, err
    result = json.loads(out)
    assert result["started"] and all(s["ok"] and s["pgid"] for s in result["starts"])
    return result["run_id"]


def test_launch_on_all_workers_follow_logs_and_per_worker_exit_codes(capsys, pod, tmp_path):
    run_id = launch(capsys, fake_trainer(tmp_path, FAILING_ON_1), "--set", "steps=2")

    status, out, err = run(capsys, "logs", run_id, "--follow")
    assert status == 1  # the run failed
    lines = out.splitlines()
    for worker in (0, 1):
        mine = [line for line in lines if line.startswith(f"[{worker}] ")]
        assert mine[0] == f"[{worker}] worker process {worker} of 2 require=2"
        assert mine[1:4] == [f"[{worker}] line {i}" for i in (1, 2, 3)]
    assert "[1] dying" in lines
    assert err.strip().endswith(f"{run_id}: failed: worker 1 exited 3: boom on 1")

    status, out, _ = run(capsys, "status", run_id, "--json")
    assert status == 0
    view = json.loads(out)
    assert view["state"] == "failed" and view["failure"] == "worker 1 exited 3: boom on 1"
    workers = {w["worker"]: w for w in view["worker_status"]}
    assert (workers[0]["state"], workers[0]["exit_status"], workers[0]["ended"]) == ("exited", 0, True)
    assert (workers[1]["state"], workers[1]["exit_status"], workers[1]["error"]) == ("exited", 3, "boom on 1")
    assert workers[0]["last_step"]["step"] == 1 and workers[0]["last_step"]["step_s"] == 0.25

    # the files of the contract, on every worker
    for worker in (0, 1):
        folder = run_folder(worker, run_id)
        assert {p.name for p in folder.iterdir()} >= {
            "launch.json",
            "config.yaml",
            "output.log",
            "events.jsonl",
            "pid",
            "exit",
        }
        manifest = json.loads((folder / "launch.json").read_text())
        assert manifest["worker"] == worker and manifest["node"] == "pod" and manifest["config"]["steps"] == 2
        assert manifest["env"]["TRAINER_PROCESS_ID"] == str(worker)
        assert "steps: 2" in (folder / "config.yaml").read_text()

    # history: the table, and the final statuses kept in the database
    status, out, _ = run(capsys, "runs", "pod")
    assert status == 0 and run_id in out and "failed" in out
    status, out, _ = run(capsys, "runs", "--json")
    (listed,) = json.loads(out)["runs"]
    assert listed["finished_at"] and [w["exit_status"] for w in listed["worker_status"]] == [0, 3]


def test_secrets_stay_out_of_files_db_and_command_lines_and_stop_kills_every_group(capsys, pod, tmp_path):
    env_file = tmp_path / "my.env"
    env_file.write_text(f"MY_SECRET={SECRET}\n")
    run_id = launch(capsys, fake_trainer(tmp_path, LONG_RUNNING), "--env-file", str(env_file))
    children = []
    for worker in (0, 1):
        folder = run_folder(worker, run_id)
        wait_for(
            lambda f=folder: (f / "child.pid").exists() and "secret-ok" in (f / "output.log").read_text()
        )
        children.append(int((folder / "child.pid").read_text()))
        env_copy = folder / ".env"
        assert env_copy.read_text() == f"MY_SECRET={SECRET}\n"
        assert (env_copy.stat().st_mode & 0o777) == 0o600
        assert SECRET not in (folder / "launch.json").read_text()
    processes = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert SECRET not in processes
    assert SECRET.encode() not in database_file().read_bytes()

    status, out, _ = run(capsys, "status", run_id)
    assert status == 0 and out.split("\n")[0].split()[4] == "running"
    assert [row.split()[:3] for row in out.splitlines()[2:4]] == [
        ["[0]", "running", "-"],
        ["[1]", "running", "-"],
    ]

    status, out, err = run(capsys, "stop", run_id, "--yes", "--grace", "3", "--json")
    assert status == 0, err
    stopped = json.loads(out)
    assert stopped["state"] == "stopped"
    assert [(w["outcome"], w["signal"], w["exit_status"]) for w in stopped["workers"]] == [
        ("stopped", "TERM", 143)
    ] * 2
    for child in children:
        wait_for(lambda c=child: not pid_alive(c), timeout=5)
    for text in (out, err):
        assert SECRET not in text
    status, out, _ = run(capsys, "runs", "--json")
    assert json.loads(out)["runs"][0]["state"] == "stopped"


def test_launch_on_a_subset_of_a_local_pod(capsys, pod, tmp_path):
    run_id = launch(capsys, fake_trainer(tmp_path, "echo one-of-$TRAINER_NUM_PROCESSES\n"), "--worker", "1")
    wait_for(lambda: (run_folder(1, run_id) / "exit").exists())
    assert (run_folder(1, run_id) / "output.log").read_text() == "one-of-1\n"
    assert not run_folder(0, run_id).exists()
    status, _, err = run(capsys, "logs", run_id, "--worker", "0")
    assert status == 2 and "worker 0 did not run" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["launch", "nope", "--config", str(CONFIG)], "unknown node 'nope'"),
        (["launch", "pod", "--config", "/no/such.yaml"], "config file /no/such.yaml does not exist"),
        (["launch", "pod", "--config", str(CONFIG), "--set", "rollout.nn=3"], "rollout.nn: unknown key"),
        (
            ["launch", "pod", "--config", str(CONFIG), "--env-file", "/no/.env"],
            "env file /no/.env does not exist",
        ),
        (["launch", "pod", "--config", str(CONFIG), "--worker", "5"], "worker 5 is out of range"),
        (["launch", "pod", "--config", str(CONFIG), "--python", " "], "--python is empty"),
        (["runs", "nope"], "unknown node 'nope'"),
        (["status", "20250101-000000-abcd"], "unknown run id"),
        (["logs", "not-a-run"], "is neither a run id"),
        (["logs", "pod", "not-a-run"], "is not a run id"),
        (["status", "pod"], "node pod has no runs yet"),
        (
            [
                "launch",
                "pod",
                "--config",
                str(CONFIG),
                "--set",
                "wandb_mode=online",
                "--set",
                "wandb_project=p",
            ],
            "wandb_mode is online but no .env gives WANDB_API_KEY",
        ),
        (
            ["launch", "pod", "--config", str(CONFIG), "--set", "rollout.batch_size=3"],
            "3 prompts do not split over 2 processes",
        ),
        (
            ["launch", "pod", "--config", str(CONFIG), "--set", "mesh_shape=3,-1,1"],
            "mesh_shape: 3,-1,1 cannot fill",
        ),
        (
            ["launch", "pod", "--config", str(CONFIG), "--set", "data.path=~/none.jsonl"],
            "data.path ~/none.jsonl does not exist on any worker of pod: write synthetic data there with "
            "`tpu-console demo pod`",
        ),
        (
            ["launch", "pod", "--config", str(CONFIG), "--set", "checkpoint.dir=~/gsm8k-synthetic.jsonl/ck"],
            "checkpoint.dir ~/gsm8k-synthetic.jsonl/ck is not writable on any worker of pod",
        ),
        (
            ["launch", "pod", "--config", str(CONFIG), "--set", "model_path=Qwen--x"],
            "nor a well-formed hub id",
        ),
        (["stop", "20250101-000000-abcd", "--yes"], "unknown run id"),
        (["logs", "20250101-000000-abcd", "--lines", "x"], "--lines 'x' is not a number"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_touches_no_worker(capsys, pod, argv, message):
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    for worker in (0, 1):
        assert not (worker_home(worker) / "tpu-console").exists()
    status, listing, _ = run(capsys, "runs", "--json")
    assert json.loads(listing)["runs"] == []


def test_a_model_missing_on_one_worker_is_refused_until_demo_makes_it(capsys, pod, tmp_path):
    shutil.rmtree(worker_home(1) / "tiny-qwen2")
    status, _, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", sys.executable)
    assert status == 2 and err.count("\n") == 1
    assert err.startswith("error: model_path ~/tiny-qwen2 does not exist on worker 1 of pod: make the tiny ")
    assert "`tpu-console demo pod`" in err and err.strip().endswith("nothing was launched")
    for worker in (0, 1):  # nothing started anywhere: no run folder on either worker, no run recorded
        assert not (worker_home(worker) / "tpu-console").exists()
    assert json.loads(run(capsys, "runs", "--json")[1])["runs"] == []

    # demo makes what is missing (worker 1's model, by the trainer) and leaves what is there alone
    status, out, err = run(capsys, "demo", "pod", "--json")
    assert status == 0, err
    done = {w["worker"]: w["done"] for w in json.loads(out)["workers"]}
    assert done[1][0] == "the tiny model: made at ~/tiny-qwen2"
    assert done[0] == ["the tiny model: already at ~/tiny-qwen2", "synthetic GSM8K data: already at "
                       "~/gsm8k-synthetic.jsonl"]
    assert (worker_home(1) / "tiny-qwen2" / "config.json").is_file()
    launch(capsys, fake_trainer(tmp_path, "echo fine\n"))
