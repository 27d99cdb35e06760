"""The worker lifecycle on a local pod through the CLI: bootstrap (twice: the second finds it in place),
sync with a .env, the real tiny trainer launched from the synced environment on every worker, the checks
that refuse a launch (mixed code, a live run), a failed start that stops the others, a job killed with
SIGKILL, and secrets masked in every output. The trainer is a bash fake (`--python`) except where the synced
environment's own interpreter is the point."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.console.launch.test_local import CONFIG, LONG_RUNNING, fake_trainer, run, run_folder, worker_home
from tests.fixtures_cli import console_home, stand_in_tiny_inputs  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console import cli
from tpu_console.fleet import run_recipes
from tpu_console.locations import database_file
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)

pytestmark = pytest.mark.usefixtures("console_home")

SECRET = "wandb-0123456789abcdef-secret"
# Prints the secret it got through the synced .env: the console must show *** instead.
LEAKY = """\
echo "my key is $MY_SECRET"
echo '{"t": 1, "kind": "step", "process": '$TRAINER_PROCESS_ID', "step": 1}' >> events.jsonl
"""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def pod(capsys) -> str:
    assert cli.main(["create", "pod", "--type", "local-2x1"]) == 0
    capsys.readouterr()
    stand_in_tiny_inputs(worker_home(w) for w in range(2))
    return "pod"


def json_run(capsys, *argv: str) -> tuple[int, dict]:
    status, out, err = run(capsys, *argv, "--json")
    return status, (json.loads(out) if out.strip() else {"stderr": err})


@pytest.mark.timeout(420)
def test_bootstrap_is_idempotent_and_sync_installs_the_checkout_with_its_env(
    capsys, tmp_path, tiny_model_dir
):
    # 2 workers x 2 CPU devices: the real trainer below runs jax.distributed across them. (It runs here, not
    # in a test of its own, so that one bootstrap and sync serve both.)
    assert run(capsys, "create", "pod", "--type", "local-2x2")[0] == 0
    stand_in_tiny_inputs(worker_home(w) for w in range(2))  # for the fake trainers launched below
    status, first = json_run(capsys, "bootstrap", "pod")
    assert status == 0, first
    assert [w["ready"] for w in first["workers"]] == ["installed", "installed"]
    for w in first["workers"]:
        assert w["versions"]["python"] and w["versions"]["jax"] and w["versions"]["flax"]
    status, second = json_run(capsys, "bootstrap", "pod")
    assert status == 0 and [w["ready"] for w in second["workers"]] == ["already", "already"]

    env_file = tmp_path / ".env"
    env_file.write_text(f"MY_SECRET={SECRET}\n")
    status, synced = json_run(capsys, "sync", "pod", "--env-file", str(env_file))
    assert status == 0, synced
    codes = [w["code"] for w in synced["workers"]]
    assert codes[0] == codes[1] and codes[0]["source"] == "wheel" and len(codes[0]["wheel_sha256"]) == 64
    for worker in (0, 1):
        home = worker_home(worker)
        synced_env = home / "tpu-console" / ".env"
        assert (
            stat.S_IMODE(synced_env.stat().st_mode) == 0o600
            and synced_env.read_text() == env_file.read_text()
        )
        assert json.loads((home / "tpu-console" / "code.json").read_text()) == codes[0]

    # The worker's environment runs the installed wheel, not this checkout.
    status, out, _ = run(
        capsys, "exec", "pod", "--", 'tpu-console/env/bin/python -c "import trainer; print(trainer.__file__)"'
    )
    assert status == 0
    for worker in (0, 1):
        assert f"[{worker}] {worker_home(worker)}/tpu-console/env/lib/" in out
    # The linked environment hides the console's libtpu: these workers have no TPU, and JAX 0.4.20 (a
    # project's pin, in front of this environment) takes an importable libtpu for a Cloud TPU VM.
    status, out, err = run(capsys, "exec", "pod", "--", 'tpu-console/env/bin/python -c "import libtpu"')
    assert status != 0 and (out + err).count("ImportError: no libtpu on this worker") == 2, out + err

    # The whole loop a new user tries first: the real trainer, launched from the synced environment; every
    # worker runs to the end, writes its `end` event and exits 0.
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    argv = ["launch", "pod", "--config", str(CONFIG)]
    for override in (
        f"model_path={tiny_model_dir}",
        f"data.path={data}",
        "steps=1",
        "eval_every_steps=0",
        "rollout.global_length=64",
        "rollout.max_length_sample=8",
    ):
        argv += ["--set", override]
    status, launched = json_run(capsys, *argv)  # --json
    assert status == 0, launched
    trainer_run = launched["run_id"]
    status, out, err = run(capsys, "logs", trainer_run, "--follow", "--lines", "all")
    assert status == 0, out[-3000:] + err[-2000:]
    for worker in (0, 1):
        assert any(line.startswith(f"[{worker}] step=1 ") for line in out.splitlines())
        folder = run_folder(worker, trainer_run)
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        assert events[0]["kind"] == "start" and events[0]["process_count"] == 2
        assert events[0]["device_count"] == 4 and events[0]["local_device_count"] == 2
        assert events[-1]["kind"] == "end" and events[-1]["process"] == worker
        assert (folder / "exit").read_text().strip() == "0"
        manifest = json.loads((folder / "launch.json").read_text())
        assert manifest["python"] == "~/tpu-console/env/bin/python"  # the synced environment, not this one
    status, view = json_run(capsys, "status", trainer_run)
    assert status == 0 and view["state"] == "succeeded"
    digests = {w["config_digest"] for w in view["worker_status"]}
    assert digests == {launched["config_digest"]}  # every process ran the config the console sent
    assert [w["last_step"]["step"] for w in view["worker_status"]] == [1, 1]

    # Secrets: masked in exec output, in logs and status; absent from the database and launch.json.
    status, out, _ = run(capsys, "exec", "pod", "--", "cat tpu-console/.env")
    assert status == 0 and SECRET not in out and "[0] MY_SECRET=***" in out
    status, out, err = run(
        capsys, "launch", "pod", "--config", str(CONFIG), "--python", fake_trainer(tmp_path, LEAKY)
    )
    assert status == 0, err
    run_id = out.strip().splitlines()[-1]
    status, out, err = run(capsys, "logs", "pod", "--follow")
    assert status == 0 and "[1] my key is ***" in out and SECRET not in out + err
    for argv in (["status", "pod"], ["status", "pod", run_id, "--json"]):
        status, out, err = run(capsys, *argv)
        assert status == 0 and SECRET not in out + err
    assert (run_folder(0, run_id) / "output.log").read_text() == f"my key is {SECRET}\n"  # it did get it
    assert stat.S_IMODE((run_folder(1, run_id) / ".env").stat().st_mode) == 0o600
    assert SECRET.encode() not in database_file().read_bytes()
    assert SECRET not in (run_folder(0, run_id) / "launch.json").read_text()

    # A worker with other code: the launch is refused, naming both, and nothing is made on any worker.
    code_file = worker_home(1) / "tpu-console" / "code.json"
    code_file.write_text(json.dumps({**codes[1], "git_sha": "0" * 40, "dirty": False}))
    status, _, err = run(capsys, "launch", "pod", "--config", str(CONFIG))
    assert status == 2 and err.count("\n") == 1
    assert (
        "do not run the same software: code differs (worker 0: " in err
        and "worker 1: 000000000000 (wheel" in err
    )
    assert "tpu-console sync pod" in err
    assert len(list((worker_home(0) / "tpu-console" / "runs").iterdir())) == 2  # only the earlier runs

    # --git: every worker clones the branch, installs it and reports the commit; the pod agrees again.
    repo = source_repo(tmp_path / "repo")
    sha = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    status, synced = json_run(capsys, "sync", "pod", "--git", f"file://{repo}", "--branch", "main")
    assert status == 0, synced
    assert [(w["code"]["source"], w["code"]["git_sha"]) for w in synced["workers"]] == [("git", sha)] * 2
    # Not refused now, and the job runs the git install's trainer, which finds the empty stand-in folder.
    status, out, err = run(capsys, "launch", "pod", "--config", str(CONFIG))
    assert status == 0, err
    status, out, err = run(capsys, "logs", "pod", "--follow", "--lines", "all")
    assert status == 1 and "tiny-qwen2/config.json" in out


def source_repo(path: Path) -> Path:
    """A git repository holding this project's sources, committed on branch main."""
    root = Path(__file__).resolve().parents[3]
    path.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, path / name)
    for package in ("tpu_console", "trainer"):
        shutil.copytree(root / package, path / package, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for argv in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "sources"]):
        subprocess.run(git + argv, check=True, capture_output=True)
    return path


def test_a_second_launch_on_a_live_run_is_refused_and_names_it(capsys, pod, tmp_path):
    python = fake_trainer(tmp_path, LONG_RUNNING)
    status, out, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", python)
    assert status == 0, err
    run_id = out.strip().splitlines()[-1]
    status, _, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", python, "--kill-stale")
    assert status == 2
    assert f"run {run_id} is still running on pod" in err and f"tpu-console stop pod {run_id}" in err
    assert len(list((worker_home(0) / "tpu-console" / "runs").iterdir())) == 1
    assert run(capsys, "stop", "pod", "--yes")[0] == 0
    status, _, err = run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", python, "--kill-stale")
    assert status == 0, err
    assert run(capsys, "stop", "pod", "--yes")[0] == 0


def test_a_failed_start_on_one_worker_stops_the_others(capsys, pod, tmp_path, monkeypatch):
    real = run_recipes.start_detached

    def start_fails_on_worker_1(run_id, python, args, env, **kw):
        if env.get("TRAINER_PROCESS_ID") == "1":
            return "( echo 'no TPU here' >&2; exit 5 )"
        return real(run_id, python, args, env, **kw)

    monkeypatch.setattr(run_recipes, "start_detached", start_fails_on_worker_1)
    status, out = json_run(
        capsys, "launch", "pod", "--config", str(CONFIG), "--python", fake_trainer(tmp_path, LONG_RUNNING)
    )
    assert status == 1
    starts = {s["worker"]: s for s in out["starts"]}
    assert starts[1]["error"] == "no TPU here" and starts[0]["pgid"]
    wait_for(lambda: not group_alive(starts[0]["pgid"]), timeout=5)  # the started worker's group was stopped
    assert (run_folder(0, out["run_id"]) / "exit").exists()
    status, view = json_run(capsys, "status", out["run_id"])
    assert view["state"] == "failed" and view["failure"] == "worker 1 lost: did not start: no TPU here"


def test_a_job_killed_with_sigkill_is_exited_or_lost_never_running(capsys, pod, tmp_path):
    python = fake_trainer(tmp_path, LONG_RUNNING)
    status, launched = json_run(capsys, "launch", "pod", "--config", str(CONFIG), "--python", python)
    assert status == 0
    pgids = {s["worker"]: s["pgid"] for s in launched["starts"]}
    os.killpg(pgids[0], signal.SIGKILL)  # the job only: its wrapper records 128+9
    wrapper = os.getsid(pgids[1])
    os.kill(wrapper, signal.SIGKILL)  # the wrapper and then the job: nobody is left to write `exit`
    os.killpg(pgids[1], signal.SIGKILL)

    def states() -> dict:
        _, view = json_run(capsys, "status", launched["run_id"])
        return {w["worker"]: (w["state"], w["exit_status"]) for w in view["worker_status"]}

    wait_for(lambda: states() == {0: ("exited", 137), 1: ("lost", None)}, timeout=5)
    _, view = json_run(capsys, "status", launched["run_id"])
    assert view["state"] == "failed"


ONE_DIES = """\
if [ "$TRAINER_PROCESS_ID" = 1 ]; then
  echo '{"t": 1, "kind": "error", "process": 1, "message": "RESOURCE_EXHAUSTED on 1"}' >> events.jsonl; exit 1
fi
while true; do sleep 0.1; done
"""


def test_a_worker_that_exits_1_while_the_other_runs_is_named_first_and_the_run_is_partially_dead(
    capsys, pod, tmp_path
):
    status, launched = json_run(
        capsys, "launch", "pod", "--config", str(CONFIG), "--python", fake_trainer(tmp_path, ONE_DIES)
    )
    assert status == 0

    def view() -> dict:
        return json_run(capsys, "status", "pod")[1]

    wait_for(lambda: view()["state"] == "partially-dead", timeout=5)
    seen = view()
    assert seen["failure"] == "worker 1 exited 1: RESOURCE_EXHAUSTED on 1"
    assert [(w["state"], w["exit_status"]) for w in seen["worker_status"]] == [
        ("running", None),
        ("exited", 1),
    ]
    status, out, _ = run(capsys, "status", "pod")
    assert "partially-dead" in out and "failed first: worker 1 exited 1" in out
    assert (
        "workers 0 still run after that failure" in out
        and f"tpu-console stop pod {launched['run_id']}" in out
    )
    assert run(capsys, "stop", "pod", "--yes")[0] == 0
    assert view()["state"] == "stopped"


def test_an_env_file_given_to_launch_is_masked_in_later_output(capsys, pod, tmp_path):
    env_file = tmp_path / "launch.env"
    env_file.write_text(f"MY_SECRET={SECRET}\n")
    status, out, err = run(
        capsys,
        "launch",
        "pod",
        "--config",
        str(CONFIG),
        "--env-file",
        str(env_file),
        "--python",
        fake_trainer(tmp_path, LEAKY),
    )
    assert status == 0, err
    run_id = out.strip().splitlines()[-1]
    status, out, err = run(capsys, "logs", "pod", "--follow")
    assert status == 0 and "my key is ***" in out and SECRET not in out + err
    status, out, _ = run(capsys, "exec", "pod", "--", f"cat tpu-console/runs/{run_id}/.env")
    assert status == 0 and "[1] MY_SECRET=***" in out and SECRET not in out
