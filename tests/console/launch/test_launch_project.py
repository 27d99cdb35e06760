"""A job file's project and setup made current before its launch, on a local pod: the project synced
(provision/project_sync.py) and the command run in it; a setup that fails (provision/project_setup.py)
named, and nothing launched. `launch -- CMD` naming a project's file where nothing is synced is refused,
and one whose synced folder changed since is launched with a warning saying so."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.console.launch.test_launch_command import bootstrapped, follow, launch
from tests.console.launch.test_local import pod, run, run_folder, worker_home  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("console_home", "pod")


def test_a_job_files_project_is_synced_first_and_the_command_runs_in_it(capsys, tmp_path):
    project = tmp_path / "my-trainer"
    (project / "my_trainer").mkdir(parents=True)
    (project / "my_trainer" / "__init__.py").write_text("")
    (project / "my_trainer" / "main.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'cwd': os.getcwd(), 'project': os.environ['TPU_CONSOLE_PROJECT_DIR'],"
        " 'path0': os.environ['PYTHONPATH'].split(':')[0], 'args': sys.argv[1:]}))\n")
    job_file = tmp_path / "job.toml"  # the project's folder is relative to the job file's
    job_file.write_text(f'command = "{sys.executable} -m my_trainer.main --steps 3"\n'
                        '[project]\ndir = "my-trainer"\n')
    run_id = launch(capsys, "--job", str(job_file))
    status, lines = follow(capsys, run_id)
    assert status == 0, lines
    for worker in (0, 1):
        job = json.loads((run_folder(worker, run_id) / "launch.json").read_text())["job"]
        folder = (worker_home(worker) / job["project"]["dir"]).resolve()
        assert job["cwd"] == job["project"]["dir"] and folder.is_dir()
        seen = json.loads(lines[worker][0])
        assert Path(seen["cwd"]).resolve() == Path(seen["project"]).resolve() == folder
        assert Path(seen["path0"]).resolve() == folder and seen["args"] == ["--steps", "3"]


def test_a_setup_that_fails_on_one_worker_is_named_and_nothing_is_launched(capsys, tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print('never')\n")
    # The setup runs with the base Python bootstrap recorded. Here that Python is a stand-in, so that
    # no environment is made (pip and uv would take seconds): worker 1's fails as a failed install
    # reports, worker 0's succeeds. The real setup's tests: tests/console/provision/.
    for worker, said in ((0, "exit 0"), (1, 'echo "@@ error pip could not install torch==9"; exit 1')):
        stand_in = tmp_path / f"python-{worker}"
        stand_in.write_text(f"#!/bin/bash\ncat >/dev/null\n{said}\n")
        stand_in.chmod(0o755)
        bootstrapped(worker, str(stand_in))
    job_file = tmp_path / "job.toml"
    job_file.write_text('command = "python train.py"\n[project]\ndir = "proj"\n'
                        '[setup]\ncommand = "pip install torch==9"\n')
    status, _, err = run(capsys, "launch", "pod", "--job", str(job_file))
    said = err.splitlines()[-1]  # after the sync's and the setup's progress
    assert status == 2 and said == ("error: the setup failed on worker(s) 1 of pod: pip could not install "
                                    "torch==9; nothing was launched")
    for worker in (0, 1):
        assert not (worker_home(worker) / "tpu-console" / "runs").exists()
    assert json.loads(run(capsys, "runs", "--json")[1])["runs"] == []


def test_a_command_naming_a_project_file_is_refused_where_no_project_is_synced(capsys):
    status, _, err = run(capsys, "launch", "pod", "--", "python", "train.py", "--steps", "3")
    assert status == 2
    assert err == ("error: no project is synced to pod, so `train.py` is not on its workers (a command "
                   "without one runs in its run folder); run `tpu-console sync pod --dir PATH` first, or "
                   "give absolute paths\n")
    for worker in (0, 1):
        assert not (worker_home(worker) / "tpu-console" / "runs").exists()
    assert json.loads(run(capsys, "runs", "--json")[1])["runs"] == []


def launched(capsys, *command: str) -> tuple[list[str], str]:
    """Launch the command on `pod`, follow it to its end: worker 0's lines and launch's stderr."""
    status, out, err = run(capsys, "launch", "pod", "--json", "--", *command)
    assert status == 0, err
    status, lines = follow(capsys, json.loads(out)["run_id"])
    assert status == 0, lines
    return lines[0], err


def test_launch_says_when_the_synced_folder_has_changed_since_the_sync(capsys, tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('as synced')\n")
    (project / "notes.txt").write_text("notes\n")
    status, out, err = run(capsys, "sync", "pod", "--dir", str(project), "--json")
    assert status == 0, err
    digest = json.loads(out)["workers"][0]["project"]["digest"]
    lines, err = launched(capsys, "python", "train.py")
    assert lines == ["as synced"] and "warning" not in err

    seen = (project / "notes.txt").stat()  # touched, not changed: nothing to say
    os.utime(project / "notes.txt", ns=(seen.st_atime_ns, seen.st_mtime_ns + 5_000_000_000))
    assert "warning" not in launched(capsys, "python", "train.py")[1]

    (project / "train.py").write_text("print('edited')\n")
    lines, err = launched(capsys, "python", "train.py")
    assert lines == ["as synced"]  # the synced copy runs, and launch said so
    assert (f"warning: {project} has changed since it was synced to pod (train.py); this run uses the synced "
            f"copy {digest}: `tpu-console sync pod --dir {project}` sends the changes") in err
    (project / "notes.txt").unlink()
    (project / "eval.py").write_text("")
    assert "(eval.py and 2 more)" in launched(capsys, "python", "train.py")[1]

    assert run(capsys, "sync", "pod", "--dir", str(project))[0] == 0
    lines, err = launched(capsys, "python", "train.py")
    assert lines == ["edited"] and "warning" not in err
