"""A project of your own on a local pod through the CLI: `sync --dir` (what git tracks and does not ignore,
content-addressed, an unchanged re-sync sending nothing), `sync --git` of any repository, `setup` into a
keyed environment (run once, "already in place" after, again when a requirement file changes), a setup
that fails on one worker named, and the bad input refused before any worker changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.console.launch.test_local import run, worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console import cli
from tpu_console.provision.project_sync import (
    content_digest,
    digest_of,
    file_states,
    project_files,
    project_path_in,
)
from tpu_console.provision.report import WorkerReport, mismatches

pytestmark = pytest.mark.usefixtures("console_home")


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=folder, capture_output=True,
        text=True, check=True, timeout=30,
    )
    return done.stdout.strip()


def a_project(folder: Path, repository: bool = True) -> Path:
    """tracked files, an untracked one, ignored ones (a folder and a pattern)."""
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "train.py").write_text("print('step=1 loss=0.5')\n")
    (folder / "requirements.txt").write_text("six\n")
    (folder / ".gitignore").write_text("outputs/\n*.log\n")
    if repository:
        git(folder, "init", "-q")
        git(folder, "add", ".")
        git(folder, "commit", "-qm", "first")
    (folder / "notes.md").write_text("not committed, not ignored\n")
    (folder / "outputs").mkdir()
    (folder / "outputs" / "ckpt").write_text("big\n")
    (folder / "run.log").write_text("noise\n")
    return folder


def json_run(capsys, *argv: str) -> tuple[int, dict, str]:
    split = argv.index("--") if "--" in argv else len(argv)  # what follows -- is the command
    status, out, err = run(capsys, *argv[:split], "--json", *argv[split:])
    return status, (json.loads(out) if out.strip() else {}), err


@pytest.fixture
def pod(capsys) -> str:
    assert cli.main(["create", "pod", "--type", "local-2x1"]) == 0
    capsys.readouterr()
    return "pod"


def test_the_files_sent_are_what_git_would_keep_and_their_digest_is_their_content(tmp_path):
    repo = a_project(tmp_path / "repo")
    files, sha, dirty = project_files(repo)
    assert files == [".gitignore", "notes.md", "pkg/train.py", "requirements.txt"]
    assert sha == git(repo, "rev-parse", "HEAD") and dirty is False
    plain = a_project(tmp_path / "plain", repository=False)  # outside a repository: .gitignore still rules
    assert project_files(plain) == (files, None, None)
    assert content_digest(repo, files) == content_digest(plain, files)  # same content, same digest
    (plain / "pkg" / "train.py").write_text("print('changed')\n")
    assert content_digest(repo, files) != content_digest(plain, files)
    assert not (plain / ".git").exists()  # the listing left the folder as it was


def test_a_folder_is_digested_again_reading_only_the_files_whose_size_mtime_or_mode_moved(tmp_path):
    repo = a_project(tmp_path / "repo", repository=False)
    files = project_files(repo)[0]
    states = file_states(repo, files)
    assert digest_of(states) == content_digest(repo, files)
    train = repo / "pkg" / "train.py"
    seen = train.stat()
    train.write_text("print('step=2 loss=0.5')\n")  # same size; its mtime put back: taken as it was, unread
    os.utime(train, ns=(seen.st_atime_ns, seen.st_mtime_ns))
    assert file_states(repo, files, states) == states
    assert content_digest(repo, files) != digest_of(states)  # read afresh, the change shows
    os.utime(train, ns=(seen.st_atime_ns, seen.st_mtime_ns + 1))
    assert digest_of(file_states(repo, files, states)) == content_digest(repo, files)


def test_the_file_a_command_names_by_a_relative_path_is_found():
    assert project_path_in(["python", "train.py", "--steps", "3"]) == "train.py"
    assert project_path_in(["bash", "-c", "cd src && ./run.sh"]) == "./run.sh"
    assert project_path_in(["python", "-m", "pkg.main", "--config=configs/a.yaml"]) == "configs/a.yaml"
    for command in (
        ["python", "-m", "pkg.train"], [sys.executable, "/abs/train.py"], ["python", "-c", "print(1)"],
        ["bash", "-c", 'if [ "$A/$B" = 1/3 ]; then exit 1; fi'], ["curl", "https://example.org/a.json"],
        ["env", "DATA=data/x", "ls"], ["~/bin/train.py"], ["no-such-program-here", "--flag"],
    ):
        assert project_path_in(command) is None, command


def test_sync_dir_unpacks_once_per_content_and_resync_sends_nothing(capsys, tmp_path, pod):
    repo = a_project(tmp_path / "nash-mhc")
    status, first, err = json_run(capsys, "sync", pod, "--dir", str(repo))
    assert status == 0, err
    projects = [w["project"] for w in first["workers"]]
    digest = projects[0]["digest"]
    assert [w["ready"] for w in first["workers"]] == ["unpacked", "unpacked"]
    assert projects[0] | {"synced_at": None} == {
        "source": "dir", "digest": digest, "dir": f"tpu-console/projects/{digest}", "name": "nash-mhc",
        "git_sha": git(repo, "rev-parse", "HEAD"), "dirty": False, "url": None, "branch": None,
        "synced_at": None,
    }
    for worker in (0, 1):
        tree = worker_home(worker) / "tpu-console" / "projects" / digest
        assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()) == [
            ".gitignore", "notes.md", "pkg/train.py", "requirements.txt"]
        current = json.loads((worker_home(worker) / "tpu-console" / "project.json").read_text())
        assert current["digest"] == digest
        (tree / "marker").write_text("left alone by a re-sync")

    status, again, err = json_run(capsys, "sync", pod, "--dir", str(repo))
    assert status == 0 and [w["ready"] for w in again["workers"]] == ["already", "already"], err
    assert "uploading" not in err
    assert (worker_home(1) / "tpu-console" / "projects" / digest / "marker").exists()

    (repo / "pkg" / "train.py").write_text("print('step=1 loss=0.25')\n")  # a change: a new folder
    status, changed, err = json_run(capsys, "sync", pod, "--dir", str(repo))
    assert status == 0, err
    project = changed["workers"][0]["project"]
    assert project["digest"] != digest and project["dirty"] is True
    assert (worker_home(0) / "tpu-console" / "projects" / digest / "marker").exists()  # the old one stays

    # Bad input: one line, exit 2, no worker touched.
    status, out, err = run(capsys, "sync", pod, "--dir", str(tmp_path / "missing"))
    assert status == 2 and err.count("error:") == 1 and "no such directory" in err


def test_sync_git_clones_any_repository_by_commit(capsys, tmp_path, pod):
    repo = a_project(tmp_path / "upstream")
    sha = git(repo, "rev-parse", "HEAD")
    branch = git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    status, first, err = json_run(capsys, "sync", pod, "--git", f"file://{repo}", "--branch", branch)
    assert status == 0, err
    project = first["workers"][1]["project"]
    assert (project["source"], project["digest"], project["git_sha"], project["name"]) == (
        "git", sha, sha, "upstream")
    assert (worker_home(1) / project["dir"] / "pkg" / "train.py").exists()
    status, again, err = json_run(capsys, "sync", pod, "--git", f"file://{repo}", "--branch", branch)
    assert status == 0 and [w["ready"] for w in again["workers"]] == ["already", "already"]
    status, out, err = run(capsys, "sync", pod, "--git", f"file://{repo}", "--branch", "no-such-branch")
    assert status == 2 and "no branch or tag no-such-branch" in err


@pytest.mark.timeout(300)
def test_setup_runs_once_per_command_requirements_and_python_and_names_a_failed_worker(
    capsys, tmp_path, pod
):
    repo = a_project(tmp_path / "proj")
    status, out, err = run(capsys, "setup", pod, "--", "true")
    assert status == 2 and "run `tpu-console bootstrap pod` first" in err  # no python.json yet
    for worker in (0, 1):  # what bootstrap records (tests/console/provision/test_python.py runs it)
        (worker_home(worker) / "tpu-console").mkdir(exist_ok=True)
        (worker_home(worker) / "tpu-console" / "python.json").write_text(json.dumps(
            {"python": sys.executable, "version": "3", "source": "image"}))
    status, out, err = run(capsys, "setup", pod, "--", "true")
    assert status == 2 and "no project on this worker; run `tpu-console sync pod --dir PATH`" in err
    assert run(capsys, "sync", pod, "--dir", str(repo))[0] == 0

    command = 'echo "$VIRTUAL_ENV $PWD" > ~/where; python -c "import sys; print(sys.prefix)" >> ~/where'
    status, first, err = json_run(capsys, "setup", pod, "--", command)
    assert status == 0, err
    # said before the command ran: no bootstrap environment here to start from
    assert ("does not see bootstrap's packages: there is none (`tpu-console bootstrap pod` makes it); the "
            "command must install everything the job imports, jax included") in err
    setup = first["workers"][0]["setup"]
    assert setup["sees_bootstrap"] is False and setup["holds_project"] is False  # the command installed none
    assert [w["ready"] for w in first["workers"]] == ["installed", "installed"]
    env = worker_home(0) / setup["env"]
    current = json.loads((worker_home(0) / "tpu-console" / "project.json").read_text())
    project_dir = worker_home(0) / current["dir"]
    assert (worker_home(0) / "where").read_text().split() == [str(env), str(project_dir), str(env)]
    assert project_dir.name == setup["project_digest"]
    assert setup["command"] == command and list(setup["requirements"]) == ["requirements.txt"]

    status, again, err = json_run(capsys, "setup", pod, "--", command)
    assert status == 0 and [w["ready"] for w in again["workers"]] == ["already", "already"]
    assert again["workers"][1]["setup"]["digest"] == setup["digest"]

    # The code changed and synced: the environment (which holds no project) still serves.
    (repo / "pkg" / "train.py").write_text("print('step=1 loss=0.25')\n")
    assert run(capsys, "sync", pod, "--dir", str(repo))[0] == 0
    status, out, err = run(capsys, "launch", pod, "--json", "--", "true")
    assert status == 0, err
    assert run(capsys, "logs", json.loads(out)["run_id"], "--follow")[0] == 0

    # A requirement file that changed and synced: launch refuses the environment made from the old one.
    (repo / "requirements.txt").write_text("six==1.16.0\n")
    assert run(capsys, "sync", pod, "--dir", str(repo))[0] == 0
    status, out, err = run(capsys, "launch", pod, "--", "true")
    assert status == 2 and err == (
        "error: the setup environment on pod was made from requirements.txt as it was before the project "
        f"synced since changed it; run `tpu-console setup pod -- {command}` again, then launch\n")

    # The setup again: a new environment (the command runs again); one that fails on worker 1 is named
    # with its last line, exit 2, and worker 1 keeps its last good setup.json.
    failing = 'if [ "$TPU_WORKER_ID" = 1 ]; then echo "ERROR: No matching distribution for six"; exit 3; fi'
    status, out, err = run(capsys, "setup", pod, "--requirements", "requirements.txt", "--", failing)
    assert status == 2
    assert err.strip().splitlines()[-1].startswith(
        "error: setup failed on worker 1: `if") and "exited 3: ERROR: No matching distribution for six" in err
    # --json: one document, the error in it (and its line on stderr)
    status, failed, err = json_run(capsys, "setup", pod, "--requirements", "requirements.txt", "--", failing)
    assert status == 2 and failed["ok"] is False and [w["ok"] for w in failed["workers"]] == [True, False]
    assert failed["error"].startswith("setup failed on worker 1: `if")
    assert err.count("error: setup failed") == 1
    setups = [json.loads((worker_home(w) / "tpu-console" / "setup.json").read_text()) for w in (0, 1)]
    assert setups[0]["digest"] != setup["digest"] and setups[1]["digest"] == setup["digest"]
    reports = [WorkerReport(w, setup=s) for w, s in enumerate(setups)]
    assert any(line.startswith("setup differs") for line in mismatches(reports))  # launch refuses the pod

    # Bad input: one line, exit 2, nothing run.
    status, out, err = run(capsys, "setup", pod, "--requirements", "requirements-tpu.txt", "--", "true")
    assert status == 2 and "requirements-tpu.txt is not in the project proj" in err
    assert run(capsys, "setup", pod, "--")[0] == 2
    assert run(capsys, "setup", pod)[0] == 2
    assert run(capsys, "setup", pod, "--python-version", "3.9", "--", "true")[0] == 2
    status, out, err = run(capsys, "setup", pod, "--python-version", "3.99", "--", "true")
    assert status == 2
    assert "no Python 3.99 on this worker; `tpu-console bootstrap pod --python-version 3.99`" in err


PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "who-runs"
version = "0.1"

[project.scripts]
who-runs = "who_runs:main"

[tool.hatch.build.targets.wheel]
packages = ["src/who_runs"]
dev-mode-dirs = ["src"]
"""
# A src layout with a console script: neither is found through the project folder on PYTHONPATH, only
# through what the setup installed. `who-runs jax` imports the JAX that bootstrap installed (the project
# names none); `who-runs SECONDS` stays that long.
WHO_RUNS = """\
import sys, time

WHO = {who!r}

def main():
    said = [WHO]
    if sys.argv[1:] == ["jax"]:
        import jax
        said += ["jax", jax.__version__]
    print(*said, flush=True)
    time.sleep(float(sys.argv[1]) if sys.argv[1:] and sys.argv[1] != "jax" else 0)
"""


def who_runs_project(folder: Path, who: str) -> Path:
    (folder / "src" / "who_runs").mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    (folder / "src" / "who_runs" / "__init__.py").write_text(WHO_RUNS.format(who=who))
    return folder


def launched_lines(capsys, *command: str) -> list[str]:
    status, out, err = run(capsys, "launch", "pod", "--json", "--", *command)
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    status, out, _ = run(capsys, "logs", run_id, "--follow", "--lines", "all")
    assert status == 0, out
    return sorted(out.splitlines())


@pytest.mark.timeout(600)
def test_a_setup_that_installs_the_project_follows_each_sync_and_starts_from_bootstraps_jax(
    capsys, tmp_path, pod
):
    import jax

    assert run(capsys, "bootstrap", pod)[0] == 0  # a local pod's: this machine's packages, JAX among them
    project = who_runs_project(tmp_path / "proj", "first")
    assert run(capsys, "sync", pod, "--dir", str(project))[0] == 0
    # offline: the build uses the hatchling bootstrap's environment has (this machine's), and no index
    # (pip sees it through the .pth file; uv runs the build backend with the environment's Python)
    editable = "pip install --no-index --no-build-isolation -e ."
    status, first, err = json_run(capsys, "setup", pod, "--", editable)
    assert status == 0, err
    assert f"sees bootstrap's packages (~/tpu-console/env, jax {jax.__version__}) after its own" in err
    setup = first["workers"][0]["setup"]
    assert setup["holds_project"] is True and setup["sees_bootstrap"] is True
    assert launched_lines(capsys, "who-runs", "jax") == [f"[{w}] first jax {jax.__version__}" for w in (0, 1)]
    expected = ["[0] first", "[1] first"]

    # A change synced, not set up: the environment still links the first sync's folder; launch refuses.
    who_runs_project(project, "second")
    status, synced, err = json_run(capsys, "sync", pod, "--dir", str(project))
    assert status == 0, err
    digest = synced["workers"][0]["project"]["digest"]
    status, out, err = run(capsys, "launch", "pod", "--", "who-runs")
    assert status == 2 and err.count("\n") == 1, err
    assert err == (f"error: the setup environment on pod holds the project {setup['project_digest']} that "
                   f"`{editable}` installed, not proj {digest} synced since; run `tpu-console setup pod -- "
                   f"{editable}` again to install it, then launch\n")
    # The same setup again: the same environment, the command run again for the new project.
    status, again, err = json_run(capsys, "setup", pod, "--", editable)
    assert status == 0 and [w["ready"] for w in again["workers"]] == ["installed", "installed"], err
    assert f"holds the project {setup['project_digest']}; running the command again for {digest}" in err
    assert again["workers"][0]["setup"]["digest"] == setup["digest"]
    assert launched_lines(capsys, "who-runs") == [line.replace("first", "second") for line in expected]
    status, same, err = json_run(capsys, "setup", pod, "--", editable)
    assert [w["ready"] for w in same["workers"]] == ["already", "already"], err

    # Not editable (the code copied into site-packages): the same, in an environment of its own; and not
    # while a run still works in it.
    copied = "pip install --no-index --no-build-isolation ."
    status, out, err = run(capsys, "setup", pod, "--", copied)
    assert status == 0, err
    status, out, err = run(capsys, "launch", "pod", "--json", "--", "who-runs", "60")
    assert status == 0, err
    long_run = json.loads(out)["run_id"]
    who_runs_project(project, "third")
    assert run(capsys, "sync", pod, "--dir", str(project))[0] == 0
    status, out, err = run(capsys, "setup", pod, "--", copied)
    assert status == 2
    assert err.splitlines()[-1].startswith(f"error: worker 0: run {long_run} still runs in ~/")
    assert f"stop it first (`tpu-console stop pod {long_run}`), then run setup again" in err
    assert run(capsys, "stop", long_run, "--yes", "--grace", "3")[0] == 0
    status, out, err = run(capsys, "setup", pod, "--", copied)
    assert status == 0, err
    assert launched_lines(capsys, "who-runs") == [line.replace("first", "third") for line in expected]

    # uv sync (the project editable, in the setup's environment through UV_PROJECT_ENVIRONMENT): the same.
    uv_sync = f"{Path(sys.prefix) / 'bin' / 'uv'} sync --offline --no-build-isolation"
    assert run(capsys, "setup", pod, "--", uv_sync)[0] == 0
    who_runs_project(project, "fourth")
    assert run(capsys, "sync", pod, "--dir", str(project))[0] == 0
    status, out, err = run(capsys, "launch", "pod", "--", "who-runs")
    assert status == 2 and f"run `tpu-console setup pod -- {uv_sync}` again" in err
    status, out, err = run(capsys, "setup", pod, "--", uv_sync)
    assert status == 0, err
    assert launched_lines(capsys, "who-runs") == [line.replace("first", "fourth") for line in expected]
