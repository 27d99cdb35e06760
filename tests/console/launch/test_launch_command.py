"""`launch NODE -- COMMAND` and `launch NODE --job FILE` end to end through the CLI, on a local pod, with a
program that knows nothing of tpu-console (tests/console/launch/foreign_job.py): the environment every
job gets, exit codes per worker, fail-fast, a restart after a transient failure (the same command again,
on the coordinator's new port), a job file recorded with the run, and bad input that starts nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.console.launch.test_local import (  # noqa: F401 - fixture
    CONFIG,
    fake_trainer,
    pod,
    run,
    run_folder,
    worker_home,
)
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.fleet.run_recipes import RUNNER_MODULES, SUPERVISOR_MODULES
from tpu_console.history.store import RunStore

pytestmark = pytest.mark.usefixtures("console_home", "pod")

FOREIGN = str(Path(__file__).resolve().parent / "foreign_job.py")
SECRET = "s3cr3t-of-the-foreign-job"


def launch(capsys, *argv: str) -> str:
    status, out, err = run(capsys, "launch", "pod", "--json", *argv)
    assert status == 0, err
    result = json.loads(out)
    assert result["started"] and all(s["ok"] for s in result["starts"])
    assert result["job"]["kind"] == "command"
    return result["run_id"]


def follow(capsys, run_id: str) -> tuple[int, dict[int, list[str]]]:
    """`logs --follow` until the run ends: its status and each worker's lines."""
    status, out, _ = run(capsys, "logs", run_id, "--follow", "--lines", "all")
    lines: dict[int, list[str]] = {0: [], 1: []}
    for line in out.splitlines():
        worker, _, text = line.partition("] ")
        lines[int(worker[1:])].append(text)
    return status, lines


def status_of(capsys, run_id: str) -> dict:
    status, out, _ = run(capsys, "status", run_id, "--json")
    assert status == 0
    return json.loads(out)


def decisions(run_id: str) -> list[dict]:
    path = run_folder(0, run_id) / "supervisor.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_foreign_program_sees_its_run_its_worker_and_its_coordinator(capsys, tmp_path):
    env_file = tmp_path / ".env"
    env_file.write_text(f"MY_SECRET={SECRET}\n")
    argv = [sys.executable, FOREIGN, "env", "jax"]
    run_id = launch(capsys, "--env-file", str(env_file), "--", *argv)
    status, lines = follow(capsys, run_id)
    assert status == 0, lines
    seen = {worker: json.loads(lines[worker][0]) for worker in (0, 1)}
    coordinator = seen[0]["env"]["JAX_COORDINATOR_ADDRESS"]
    for worker in (0, 1):
        folder = run_folder(worker, run_id).resolve()
        env = seen[worker]["env"]
        assert Path(seen[worker]["cwd"]).resolve() == folder  # no project synced: the run folder
        assert Path(env["TPU_CONSOLE_RUN_DIR"]).resolve() == folder
        assert (env["TPU_CONSOLE_RUN_ID"], env["TPU_CONSOLE_NODE"]) == (run_id, "pod")
        assert (env["TPU_CONSOLE_WORKER"], env["TPU_CONSOLE_WORKER_COUNT"]) == (str(worker), "2")
        # the coordinator under the names jax.distributed.initialize and torch-style launchers read
        assert env["JAX_COORDINATOR_ADDRESS"] == env["TPU_CONSOLE_COORDINATOR_ADDRESS"] == coordinator
        assert coordinator == f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        assert (env["TPU_CONSOLE_NUM_PROCESSES"], env["WORLD_SIZE"]) == ("2", "2")
        assert env["TPU_CONSOLE_PROCESS_ID"] == env["RANK"] == str(worker)
        assert env["VIRTUAL_ENV"] is None and env["TPU_CONSOLE_PROJECT_DIR"] is None
        assert seen[worker]["has_secret"] is True  # the .env reached it through the environment only
        # and they are the names the installed JAX reads: jax.distributed.initialize found the coordinator
        # in JAX_COORDINATOR_ADDRESS (it has no variable for the count and id: the program passed ours)
        assert f"jax process {worker} of 2" in lines[worker]

        manifest_text = (run_folder(worker, run_id) / "launch.json").read_text()
        assert SECRET not in manifest_text
        manifest = json.loads(manifest_text)
        job = manifest["job"]
        assert manifest["command"] == argv and "config" not in manifest
        assert not (run_folder(worker, run_id) / "config.yaml").exists()
        assert (job["kind"], job["command"], job["project"], job["setup"]) == ("command", argv, None, None)
        assert job["cwd"] == f"tpu-console/runs/{run_id}" and job["metrics"]["format"] == "auto"
    assert RunStore().get(run_id).job == job  # the history keeps the same object
    view = status_of(capsys, run_id)
    assert view["state"] == "succeeded"
    assert [w["exit_status"] for w in view["worker_status"]] == [0, 0]


def test_the_bundled_trainer_is_the_built_in_job(capsys, tmp_path):
    fake = fake_trainer(tmp_path, 'echo "run=$TPU_CONSOLE_RUN_ID worker=$TPU_CONSOLE_WORKER"\n')
    status, out, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", fake, "--json")
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    status, lines = follow(capsys, run_id)
    assert status == 0 and lines[1] == [f"run={run_id} worker=1"]  # every job's variables, the trainer's too
    manifest = json.loads((run_folder(1, run_id) / "launch.json").read_text())
    job = manifest["job"]
    trainer = [fake, "-u", "-m", "trainer", "--config", "config.yaml", "--run-dir", "."]
    assert (job["kind"], job["command"]) == ("trainer", trainer)
    assert job["cwd"] == f"tpu-console/runs/{run_id}" and job["project"] is None
    assert manifest["config_digest"] and (run_folder(1, run_id) / "config.yaml").exists()
    assert RunStore().get(run_id).job == job


def test_each_workers_exit_status_is_kept(capsys):
    run_id = launch(capsys, "--", sys.executable, FOREIGN, "exit", "1=5")
    status, _ = follow(capsys, run_id)
    assert status == 1  # the run failed
    view = status_of(capsys, run_id)
    assert view["state"] == "failed" and view["failure"].startswith("worker 1 exited 5")
    assert [w["exit_status"] for w in view["worker_status"]] == [0, 5]
    # what launch shipped: the runner's files on every worker, the supervisor's on the first alone
    shipped = [{f.name for f in run_folder(w, run_id).glob("*.py")} for w in (0, 1)]
    assert shipped == [set(RUNNER_MODULES) | set(SUPERVISOR_MODULES), set(RUNNER_MODULES)]

    # a program that is not there: a shell's 127 and one line in the log, not the job runner's traceback
    run_id = launch(capsys, "--", "no-such-program-here", "--flag")
    status, lines = follow(capsys, run_id)
    assert status == 1
    assert lines[0][0] == "tpu-console: cannot start no-such-program-here: No such file or directory"
    assert [w["exit_status"] for w in status_of(capsys, run_id)["worker_status"]] == [127, 127]


def test_fail_fast_stops_the_other_workers_when_one_fails(capsys):
    run_id = launch(capsys, "--fail-fast", "--", sys.executable, FOREIGN, "fail", "1", "3")
    status, lines = follow(capsys, run_id)
    assert status == 1 and "worker 1 gives up" in lines[1]
    view = status_of(capsys, run_id)
    exits = {w["worker"]: w["exit_status"] for w in view["worker_status"]}
    assert exits == {0: 143, 1: 3}  # worker 0 would have run forever: the supervisor sent it SIGTERM
    assert "stop-others" in [d["decision"] for d in decisions(run_id)]


def test_a_transient_failure_runs_the_same_command_again_on_a_new_coordinator_port(capsys):
    run_id = launch(capsys, "--restart-on", "transient", "--max-restarts", "1", "--",
                    sys.executable, FOREIGN, "transient", "1")
    status, lines = follow(capsys, run_id)
    assert status == 0, lines
    (restart,) = [d for d in decisions(run_id) if d["decision"] == "restart"]
    assert restart["cause"] == "distributed_timeout"
    first = json.loads((run_folder(0, run_id) / "launch.json").read_text())["env"]["MASTER_PORT"]
    for worker in (0, 1):
        log = (run_folder(worker, run_id) / "output.log").read_text()
        assert f"starting worker {worker}'s job again" in log
        done = [line.split() for line in log.splitlines() if line.startswith("done at ")]
        address, port = done[-1][2], done[-1][3]
        assert address.endswith(f":{port}") and port != first  # every coordinator name moved together
        assert (run_folder(worker, run_id) / "exit").read_text().strip() == "0"
    assert "DEADLINE_EXCEEDED" in (run_folder(1, run_id) / "output.log").read_text()


def test_a_job_file_is_launched_and_recorded_with_the_run(capsys, tmp_path):
    job_file = tmp_path / "foreign.toml"
    text = (f"command = [{json.dumps(sys.executable)}, {json.dumps(FOREIGN)}, \"env\"]\n"
            "[env]\nFROM_JOB_FILE = \"yes\"\n"
            "[metrics]\nformat = \"none\"\n"
            "[supervisor]\nrestart_on = [\"transient\"]\nmax_restarts = 2\n")
    job_file.write_text(text)
    run_id = launch(capsys, "--job", str(job_file), "--fail-fast")  # a flag given here joins the file's
    status, lines = follow(capsys, run_id)
    assert status == 0
    assert json.loads(lines[1][0])["env"]["FROM_JOB_FILE"] == "yes"
    manifest = json.loads((run_folder(1, run_id) / "launch.json").read_text())
    assert manifest["env"]["FROM_JOB_FILE"] == "yes" and manifest["fail_fast"] is True
    job = manifest["job"]
    assert (job["job_file"], job["job_file_text"]) == (str(job_file.resolve()), text)
    assert job["metrics"]["format"] == "none"
    plan = json.loads((run_folder(0, run_id) / "supervision.json").read_text())
    assert plan["max_restarts"] == 2 and "distributed_timeout" in plan["restart_on"]
    # each fact once: the run's own (fail-fast among them) are in its record, never in the plan
    record_facts = {"run_id", "node", "provider", "workers", "started_at", "fail_fast", "price_per_hour"}
    assert not record_facts & set(plan)
    assert RunStore().get(run_id).job["job_file_text"] == text


@pytest.mark.parametrize(
    ("argv", "job_file", "message"),
    [
        (["--"], None, "-- is followed by no command"),
        (["--config", "x.yaml", "--", "ls"], None, "--config launches the bundled trainer and -- COMMAND"),
        ([], None, "nothing to launch: give --config FILE"),
        (["--set", "steps=1", "--", "ls"], None, "--set overrides a key of the trainer's config"),
        (["--python", "python3", "--", "ls"], None, "--python chooses the bundled trainer's interpreter"),
        (["--job", "/no/such.toml"], None, "job file /no/such.toml does not exist"),
        ([], 'command = "ls"\n[supervisor]\nfail_fats = true\n', "unknown key 'supervisor.fail_fats'"),
        ([], 'command = "ls"\nflavour = 1\n', "unknown key 'flavour'"),
        ([], 'command = "ls\n', "is not valid TOML"),
        ([], "[env]\nA = '1'\n", "has no command"),
        ([], 'command = "ls"\n[project]\ndir = "no-such-folder"\n', "project.dir 'no-such-folder' is not a"),
        ([], 'command = "ls"\n[metrics]\nformat = "regex"\nregex = "loss (\\\\d+)"\n', "no named group"),
        ([], 'command = "ls"\n[env]\nHF_TOKEN = "x"\n', "HF_TOKEN looks like a secret"),
        ([], 'command = "ls"\n[supervisor]\nrestart_on = ["oom"]\n', "a oom failure fails the same way"),
        (["--max-hang", "30m"], 'command = "ls"\n[metrics]\nformat = "none"\n', "format none reads no step"),
        (["--max-hang", "30m", "--metrics", "none", "--", "ls"], None, "format none reads no step"),
        ([], 'command = "ls"\n[metrics]\nformat = "none"\n[supervisor]\nmax_hang = 60\n', "--max-hang stops"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_starts_nothing(capsys, tmp_path, argv, job_file, message):
    if job_file is not None:
        path = tmp_path / "job.toml"
        path.write_text(job_file)
        argv = ["--job", str(path), *argv]
    status, _, err = run(capsys, "launch", "pod", *argv)
    assert status == 2, err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    if job_file is not None and "unknown key" in message:
        assert str(tmp_path / "job.toml") in err  # the file is named with the key
    for worker in (0, 1):
        assert not (worker_home(worker) / "tpu-console").exists()
    assert json.loads(run(capsys, "runs", "--json")[1])["runs"] == []


def bootstrapped(worker: int, python: str = sys.executable) -> Path:
    """What bootstrap records on a local worker: the base Python a setup's environment is made from."""
    root = worker_home(worker) / "tpu-console"
    root.mkdir(parents=True, exist_ok=True)
    version = ".".join(map(str, sys.version_info[:3]))
    (root / "python.json").write_text(json.dumps({"python": python, "version": version}))
    return root


def test_a_command_runs_with_the_setups_environment_first_on_its_path(capsys):
    for worker in (0, 1):  # what a setup that succeeded leaves: its environment and setup.json
        root = bootstrapped(worker)
        (root / "envs" / "s1" / "bin").mkdir(parents=True)
        (root / "envs" / "s1" / "bin" / "python").symlink_to(sys.executable)
        (root / "setup.json").write_text(json.dumps({"digest": "s1", "env": "tpu-console/envs/s1"}))
    code = "import os, shutil; print(shutil.which('python'), os.environ['VIRTUAL_ENV'])"
    run_id = launch(capsys, "--", "python", "-c", code)
    status, lines = follow(capsys, run_id)
    assert status == 0, lines
    for worker in (0, 1):
        env = worker_home(worker) / "tpu-console" / "envs" / "s1"
        assert lines[worker] == [f"{env}/bin/python {env}"]  # `python` is the setup's
        job = json.loads((run_folder(worker, run_id) / "launch.json").read_text())["job"]
        assert (job["env_dir"], job["setup"]["digest"]) == ("tpu-console/envs/s1", "s1")


def test_launches_on_different_worker_subsets_meet_at_one_lock(capsys):
    """The node's launch lock lives on worker 0 whichever workers a launch selects: a run on worker 1 holds
    the node against a launch on worker 0, and the lock goes with the run once it is stopped."""
    run_id = launch(capsys, "--worker", "1", "--", sys.executable, FOREIGN, "fail", "9", "0")  # never ends
    status, _, err = run(capsys, "launch", "pod", "--worker", "0", "--", sys.executable, FOREIGN, "exit",
                         "0=0")
    assert status == 2 and err.count("\n") == 1
    assert f"run {run_id} is still running on pod" in err and "tpu-console stop pod" in err
    assert not (run_folder(0, run_id)).exists()  # the lock is on worker 0, the run only on worker 1
    assert (worker_home(0) / "tpu-console" / "launch.lock").is_dir()
    assert run(capsys, "stop", run_id, "--yes")[0] == 0
    assert not (worker_home(0) / "tpu-console" / "launch.lock").exists()
    other = launch(capsys, "--worker", "0", "--", sys.executable, FOREIGN, "exit", "0=0")
    status, out, err = run(capsys, "logs", other, "--follow")
    assert status == 0, err
