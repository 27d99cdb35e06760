"""The job file and the command as data (launch/job_spec.py), and the run history's `job` column, also in a
database made before it existed. Pure and fast: no pod."""

from __future__ import annotations

import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.console.history.test_units import bash, write_fake
from tests.fixtures_cli import make_node
from tests.processes import wait_for
from tpu_console.errors import UserError
from tpu_console.fleet import run_recipes
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.launch.job_kinds import command_job
from tpu_console.launch.job_spec import JobSpec, load_job_file
from tpu_console.provision.report import WorkerReport
from tpu_console.views.runs import job_label


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "grpo.toml"
    path.write_text(text)
    return path


def test_a_job_file_in_full(tmp_path):
    (tmp_path / "nash-mhc").mkdir()
    text = """\
command = "python -m nash_mhc.train --mesh-data 2 --note 'two words'"
[project]
dir = "nash-mhc"
[setup]
command = "pip install -r requirements-tpu.txt"
requirements = ["requirements-tpu.txt"]
python = "3.12"
[env]
XLA_FLAGS = "--xla_dump_to=/tmp/x"
[metrics]
format = "regex"
regex = 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+)'
tensorboard = "logs/tb"
[supervisor]
fail_fast = true
restart_on = ["transient"]
max_restarts = 3
on_end = "delete"
grace = "10m"
max_hang = "30m"
on_straggler = "restart"
"""
    spec = load_job_file(write(tmp_path, text))
    # split as a shell splits words, but no shell will run it
    assert spec.command == ["python", "-m", "nash_mhc.train", "--mesh-data", "2", "--note", "two words"]
    assert spec.project_dir() == (tmp_path / "nash-mhc").resolve()  # relative to the job file's folder
    assert spec.setup.python == "3.12" and spec.env == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    assert JobSpec(command=["x"], env={"MONKEY": "1", "TOKENIZER": "bpe"}).env["MONKEY"] == "1"  # not secrets
    assert spec.job_file_text == text and spec.record()["job_file_text"] == text
    policy = spec.policy()
    assert policy.fail_fast and policy.on_end == "delete" and policy.grace_s == 600
    assert policy.max_hang_s == 1800 and "distributed_timeout" in policy.restart_on
    assert policy.on_straggler == "restart" and spec.policy(on_straggler="report").on_straggler == "report"
    # the flags given on the command line win over the file
    assert spec.policy(max_restarts=1, grace="1m").max_restarts == 1
    assert spec.policy(grace="1m").grace_s == 60
    assert spec.policy(on_end="keep").on_end == "keep"  # --on-end keep: the file's grace goes with its delete
    with pytest.raises(UserError, match="--grace"):
        spec.policy(on_end="keep", grace="5m")


def test_flags_over_a_file_without_supervisor_options(tmp_path):
    spec = load_job_file(write(tmp_path, 'command = ["./train.sh", "a b"]\n'))
    assert spec.command == ["./train.sh", "a b"] and spec.project is None
    assert spec.policy().fail_fast is False and spec.policy(fail_fast=True).fail_fast is True
    assert spec.with_command(["python", "x.py"]).command == ["python", "x.py"]
    assert spec.digest() != spec.with_command(["python", "x.py"]).digest()
    # `launch --job F -- CMD`: the command line's command, also for a file that gives none
    no_command = write(tmp_path, '[env]\nXLA_FLAGS = "--x"\n')
    assert load_job_file(no_command, ["python", "y.py"]).command == ["python", "y.py"]
    with pytest.raises(UserError, match="has no command"):
        load_job_file(no_command)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('command = "x"\n[setup]\ncomand = "pip install ."\n', "unknown key 'setup.comand'"),
        ('command = "x"\n[project]\ndir = "."\ngit = "https://x"\n', "project: give one of dir or git"),
        ('command = "x"\n[project]\ndir = "."\nbranch = "main"\n', "branch goes with git"),
        ('command = []\n', "command: is empty"),
        ('command = "x \'unclosed"\n', "command: cannot be split into words"),
        ('command = "x"\n[metrics]\nformat = "regex"\n', "format = 'regex' needs regex"),
        ('command = "x"\n[metrics]\nregex = "(unclosed"\n', "regex is not a regular expression"),
        ('command = "x"\n[metrics]\nformat = "csv"\n', "metrics.format"),
        ('command = "x"\n[env]\n"BAD NAME" = "1"\n', "'BAD NAME' is not an environment variable name"),
        ('command = "x"\n[env]\nWANDB_API_KEY = "k"\n', "WANDB_API_KEY looks like a secret"),
        ('command = "x"\n[supervisor]\non_straggler = "kill"\n', "supervisor.on_straggler: Input should be"),
    ],
)
def test_a_bad_job_file_is_one_line_naming_the_file(tmp_path, text, message):
    with pytest.raises(UserError) as refused:
        load_job_file(write(tmp_path, text))
    said = str(refused.value)
    assert message in said and str(tmp_path / "grpo.toml") in said and "\n" not in said


def test_a_command_line_without_a_command_is_refused():
    with pytest.raises(UserError, match="-- is followed by no command"):
        JobSpec.from_command([])
    assert JobSpec.from_command(["bash", "-c", "echo $HOME"]).command == ["bash", "-c", "echo $HOME"]
    assert JobSpec.from_command_line("bash -c 'echo $HOME'").command == ["bash", "-c", "echo $HOME"]
    with pytest.raises(UserError, match="close its quotes"):
        JobSpec.from_command_line("python -c 'print(1)")
    with pytest.raises(UserError, match="no command"):
        JobSpec.from_command_line("  ")


def record(run_id: str, job: dict | None) -> RunRecord:
    return RunRecord(run_id=run_id, node="pod", provider="local", accelerator_type="local-2x1",
                     workers=[0, 1], config_path="job.toml", config_digest="d", overrides=[],
                     python="python3", started_at=datetime.now(UTC), job=job)


def test_the_job_is_kept_with_the_run_also_in_a_database_made_before_it(tmp_path):
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as db:  # the first release's table, and a run recorded then
        db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, node TEXT NOT NULL, provider TEXT NOT NULL, "
                   "accelerator_type TEXT NOT NULL, workers TEXT NOT NULL, config_path TEXT NOT NULL, "
                   "config_digest TEXT NOT NULL, overrides TEXT NOT NULL, code_version TEXT, python TEXT NOT "
                   "NULL, started_at TEXT NOT NULL, state TEXT NOT NULL, failure TEXT, finished_at TEXT, "
                   "stop_requested_at TEXT)")
        db.execute("INSERT INTO runs VALUES ('old', 'pod', 'local', 't', '[0]', 'c.yaml', 'd', '[]', NULL, "
                   "'python3', '2025-01-01T00:00:00+00:00', 'succeeded', NULL, NULL, NULL)")
    store = RunStore(path)
    assert store.get("old").job is None  # older runs (and any code reading them) see None
    job = {"kind": "command", "command": ["python", "train.py"], "cwd": "tpu-console/projects/abc"}
    store.add(record("new", job))
    assert RunStore(path).get("new").job == job


def worker(index: int, project: str | None, setup: str | None = None, python: str = "3.12.1") -> WorkerReport:
    report = WorkerReport(index, env_present=True, versions={"jax": "0.7.2"}, python_info={"version": python})
    if project:
        report.project = {"digest": project, "dir": f"tpu-console/projects/{project}", "source": "dir"}
    if setup:
        report.setup = {"digest": setup, "env": f"tpu-console/envs/{setup}", "project_digest": project}
    return report


def test_a_command_runs_in_the_project_with_its_setups_environment():
    spec = JobSpec.from_command(["python", "-m", "train"])
    prepared = command_job(spec, make_node("pod"), [worker(0, "p1", "s1"), worker(1, "p1", "s1")], True)
    record = prepared.record("RUN")
    assert (record["cwd"], record["env_dir"]) == ("tpu-console/projects/p1", "tpu-console/envs/s1")
    assert record["project"]["digest"] == "p1" and record["setup"]["digest"] == "s1"
    assert prepared.home_prepend == {"PATH": "tpu-console/envs/s1/bin",
                                     "PYTHONPATH": "tpu-console/projects/p1"}
    assert prepared.home_env == {"VIRTUAL_ENV": "tpu-console/envs/s1",
                                 "TPU_CONSOLE_PROJECT_DIR": "tpu-console/projects/p1"}
    # no project, no setup: the run folder, and bootstrap's environment since every worker has one
    bare = command_job(spec, make_node("pod"), [worker(0, None), worker(1, None)], True)
    assert bare.record("RUN")["cwd"] == "tpu-console/runs/RUN" and bare.env_dir == "tpu-console/env"


def test_a_setup_that_installed_an_earlier_sync_of_the_project_is_refused_and_one_that_did_not_is_not():
    def synced_since(holds: bool) -> list[WorkerReport]:
        reports = [worker(w, "p2", "s1") for w in (0, 1)]
        for report in reports:  # set up with the sync p1, then p2 synced
            report.setup.update(project_digest="p1", holds_project=holds, command="pip install -e .")
        return reports

    spec = JobSpec.from_command(["my-console-script"])
    with pytest.raises(UserError) as refused:
        command_job(spec, make_node("pod"), synced_since(True), False)
    assert str(refused.value) == (
        "the setup environment on pod holds the project p1 that `pip install -e .` installed, not p2 synced "
        "since; run `tpu-console setup pod -- pip install -e .` again to install it, then launch")
    assert command_job(spec, make_node("pod"), synced_since(False), True).cwd == "tpu-console/projects/p2"
    # where no worker holds a project, a file the command names by a relative path is not there
    with pytest.raises(UserError, match="no project is synced to pod, so `train.py` is not on its workers"):
        command_job(JobSpec.from_command(["python", "train.py"]), make_node("pod"), [worker(0, None)], True)


@pytest.mark.parametrize(
    ("reports", "message"),
    [
        ([worker(0, "p1"), worker(1, "p2")], "project differs (worker 0: p1, worker 1: p2)"),
        ([worker(0, "p1"), worker(1, None)], "project differs (worker 0: p1, worker 1: none)"),
        ([worker(0, "p1", "s1"), worker(1, "p1", "s2")], "setup differs"),
        ([worker(0, "p1", python="3.10.12"), worker(1, "p1")], "python differs"),
    ],
)
def test_workers_that_hold_different_projects_or_environments_are_refused(reports, message):
    with pytest.raises(UserError) as refused:
        command_job(JobSpec.from_command(["python", "x.py"]), make_node("pod"), reports, True)
    assert "--no-code-check" in str(refused.value) and message in str(refused.value)
    # --no-code-check launches anyway
    command_job(JobSpec.from_command(["python", "x.py"]), make_node("pod"), reports, False)


def test_the_start_puts_the_environment_and_the_project_first_under_the_workers_home(tmp_path):
    """start_detached in real bash with a temporary HOME: folders under the home with spaces stay one word."""
    fake = write_fake(tmp_path / "py", 'printf "%s\\n" "$PATH" "$PYTHONPATH" "$VIRTUAL_ENV" '
                                       '"$TPU_CONSOLE_RUN_DIR"\n')
    bash(run_recipes.prepare_run_dir("R1"), tmp_path)
    command = run_recipes.start_detached("R1", str(fake), [], {}, home_env={"VIRTUAL_ENV": "envs/my env"},
                                     home_prepend={"PATH": "envs/my env/bin", "PYTHONPATH": "projects/p"})
    assert bash(command, tmp_path).returncode == 0
    folder = tmp_path / run_recipes.run_dir("R1")
    wait_for(lambda: (folder / "exit").exists())
    path, pythonpath, venv, run_dir = (folder / "output.log").read_text().splitlines()
    assert path.startswith(f"{tmp_path}/envs/my env/bin:") and path.endswith(os.environ["PATH"])
    assert pythonpath == f"{tmp_path}/projects/p"  # no empty entry when there was none before
    assert venv == f"{tmp_path}/envs/my env" and run_dir == str(folder)


def test_the_runs_table_names_what_each_run_ran():
    trainer = record("a", {"kind": "trainer", "command": ["python", "-m", "trainer"]})
    trainer.config_path = "/home/me/trainer/configs/tiny_local.yaml"
    assert job_label(trainer) == "tiny_local.yaml"
    command = record("b", {"kind": "command", "command": ["/usr/bin/python3", "-m", "my_trainer", "--steps",
                                                         "100", "--mesh-data", "2"], "job_file": None})
    assert job_label(command) == "python3 -m my_trainer --steps..."  # cut to the width of a cell
    from_file = record("c", {"kind": "command", "command": ["x"], "job_file": "/home/me/grpo.toml"})
    from_file.config_path = "/home/me/grpo.toml"
    assert job_label(from_file) == "grpo.toml" and job_label(record("d", None)) == "job.toml"


def test_launch_metrics_overrides_the_files_format_and_regex_and_keeps_where_else_progress_is(tmp_path):
    spec = load_job_file(write(tmp_path, 'command = "x"\n[metrics]\nformat = "none"\ntensorboard = "tb"\n'))
    keras = spec.with_metrics("keras")
    assert (keras.metrics.format, keras.metrics.regex, keras.metrics.tensorboard) == ("keras", None, "tb")
    regex = spec.with_metrics(r"it (?P<step>\d+)")
    assert (regex.metrics.format, regex.metrics.regex) == ("regex", r"it (?P<step>\d+)")
    assert regex.record()["metrics"]["regex"] == r"it (?P<step>\d+)" and regex.digest() != spec.digest()
    assert regex.with_metrics("auto").metrics.regex is None
    for given, says in [("(", "is neither a format"), (r"it (\d+)", "no named group `step`"),
                        ("kears", "no named group `step`; write (?P<step>\\d+) where the step number is, or "
                         "give a format (auto, seeds, maxtext, jsonl, loop, tqdm, keras, none)"),
                        ("regex", "give the regular expression itself")]:
        with pytest.raises(UserError) as refused:
            spec.with_metrics(given)
        assert says in str(refused.value) and "\n" not in str(refused.value)


def test_the_formats_a_job_may_name_are_the_ones_the_worker_reads():
    from tpu_console.observe.metric_formats import METRIC_FORMATS
    from tpu_console.worker import step_lines

    assert set(METRIC_FORMATS) == set(step_lines.FORMATS)
