"""Provisioning without a pod: secrets parsing and masking, the workers' reports, the stale-holder recipe
run in real bash, and which run a person means (resolve_run)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import pid_alive
from tpu_console.errors import UserError
from tpu_console.provision import worker_recipes
from tpu_console.provision.report import WorkerReport, mismatches
from tpu_console.provision.requirements import environment_digest, trainer_requirements
from tpu_console.secrets import SecretMasker, parse_env, remember_env_file, remembered_env_files


def test_parse_env_reads_what_bash_would_source():
    text = "# comment\nexport A=1\nB = 'two words'\nC=\"x=y\"\n\nnot a line\nD=\n"
    assert parse_env(text) == {"A": "1", "B": "two words", "C": "x=y", "D": ""}


def test_masker_hides_every_value_longest_first_and_leaves_short_ones():
    masker = SecretMasker(["wandb-key-123", "wandb-key-123456", "1", ""])
    text = "key=wandb-key-123456 and wandb-key-123 and 1"
    assert masker.mask(text) == "key=*** and *** and 1"
    assert not SecretMasker([]) and SecretMasker([]).mask("x") == "x"


def test_env_sources_are_remembered_by_path_never_by_value(tmp_path):
    env = tmp_path / ".env"
    env.write_text("WANDB_API_KEY=abcd-very-secret\n")
    remember_env_file("pod", env)
    remember_env_file("pod", env)
    assert remembered_env_files("pod") == [str(env.resolve())]
    from tpu_console.locations import home

    assert "abcd-very-secret" not in (home() / "secret_sources.json").read_text()
    assert SecretMasker.for_node("pod").mask("k=abcd-very-secret") == "k=***"
    assert SecretMasker.for_node("other").mask("k=abcd-very-secret") == "k=abcd-very-secret"


def test_worker_report_parses_markers_and_names_mismatches():
    code = {"source": "wheel", "git_sha": "a" * 40, "dirty": True, "wheel_sha256": "f" * 64}
    out = "\n".join(
        [
            "@@ step creating",
            "pip noise",
            "@@ ready installed",
            "@@ versions "
            + json.dumps({"python": "3.11.7", "jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": None}),
            "@@ code " + json.dumps(code),
            "@@ live 20250101-000000-abcd 4242",
            "@@ env present",
        ]
    )
    a = WorkerReport.parse(0, out)
    assert a.ready == "installed" and a.env_present and a.live_runs == {"20250101-000000-abcd": 4242}
    assert a.code_label == "aaaaaaaaaaaa+dirty (wheel ffffffff)"
    assert a.versions_label() == "python=3.11.7 jax=0.10.2 jaxlib=0.10.2"
    b = WorkerReport.parse(
        1, out.replace('"jax": "0.10.2"', '"jax": "0.9.0"').replace('"dirty": true', '"dirty": false')
    )
    assert mismatches([a, a]) == []
    assert mismatches([a, b]) == [
        "code differs (worker 0: aaaaaaaaaaaa+dirty (wheel ffffffff), worker 1: aaaaaaaaaaaa (wheel "
        "ffffffff))",
        "jax differs (worker 0: 0.10.2, worker 1: 0.9.0)",
    ]


def test_requirements_pick_the_jax_flavour_and_the_digest_follows_them():
    tpu, cpu = trainer_requirements("tpu"), trainer_requirements("cpu")
    assert any(r.startswith("jax[tpu]") for r in tpu) and not any(r.startswith("jax[") for r in cpu)
    assert any(r.startswith("flax") for r in cpu) and not any(r.startswith("textual") for r in cpu)
    assert environment_digest(tpu, "python3", None) != environment_digest(cpu, "python3", None)
    assert environment_digest(cpu, "python3", None) == environment_digest(list(cpu), "python3", None)


def test_kill_stale_kills_device_holders_and_removes_the_lockfile(tmp_path):
    device = tmp_path / "accel0"
    device.write_text("")
    lock = tmp_path / "libtpu_lockfile"
    lock.write_text("")
    holder = subprocess.Popen(["bash", "-c", f"exec 3<{device}; exec sleep 60"])
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        for _ in range(100):  # until the holder has its file open
            if any(str(device) in str(p.resolve()) for p in Path(f"/proc/{holder.pid}/fd").iterdir()):
                break
            time.sleep(0.02)
        command = worker_recipes.kill_stale((str(tmp_path / "accel") + "*",), str(lock))
        done = subprocess.run(
            ["bash", "-c", command], check=False, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        report = WorkerReport.parse(0, done.stdout)
        assert report.killed == [f"{holder.pid} sleep {device}"]
        assert report.removed == [str(lock)]
        holder.wait(5)
        assert not lock.exists() and pid_alive(bystander.pid)
    finally:
        for p in (holder, bystander):
            p.kill()
            p.wait()


@pytest.mark.usefixtures("console_home")
async def test_resolve_run_takes_a_run_id_a_node_or_both():
    from datetime import UTC, datetime

    from tpu_console.history.resolve import resolve_run
    from tpu_console.history.store import RunRecord, RunStore

    store = RunStore()
    for run_id in ("20250101-000000-aaaa", "20250102-000000-bbbb"):
        store.add(
            RunRecord(
                run_id=run_id,
                node="pod",
                provider="local",
                accelerator_type="local-2x1",
                workers=[0, 1],
                config_path="c.yaml",
                config_digest="d",
                overrides=[],
                python="python3",
                started_at=datetime.now(UTC),
                code_version=None,
            )
        )
    assert (await resolve_run(store, {}, "pod")).run_id == "20250102-000000-bbbb"
    assert (await resolve_run(store, {}, "20250101-000000-aaaa")).run_id == "20250101-000000-aaaa"
    assert (await resolve_run(store, {}, "pod", "20250101-000000-aaaa")).run_id == "20250101-000000-aaaa"
    with pytest.raises(UserError, match="ran on pod, not other"):
        await resolve_run(store, {}, "other", "20250101-000000-aaaa")
    with pytest.raises(UserError, match="neither a run id"):
        await resolve_run(store, {}, "ghost")


def test_inspect_worker_reads_python_project_and_setup_records(tmp_path):
    root = tmp_path / "tpu-console"
    root.mkdir()
    python = {"python": "/usr/bin/python3.12", "version": "3.12.1", "source": "found"}
    project = {"source": "dir", "digest": "d" * 16, "dir": "tpu-console/projects/" + "d" * 16, "name": "p"}
    setup = {"digest": "e" * 16, "env": "tpu-console/envs/" + "e" * 16, "command": "pip install -e ."}
    run = subprocess.run(
        ["bash", "-c", worker_recipes.inspect_worker()], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True, timeout=30,
    )
    bare = WorkerReport.parse(0, run.stdout)
    assert bare.env_present is False and (bare.python_info, bare.project, bare.setup) == (None, None, None)
    (root / "python.json").write_text(json.dumps(python, indent=1) + "\n")  # several lines: still one marker
    (root / "project.json").write_text(json.dumps(project))
    (root / "setup.json").write_text(json.dumps(setup))
    run = subprocess.run(
        ["bash", "-c", worker_recipes.inspect_worker()], env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True, timeout=30,
    )
    report = WorkerReport.parse(0, run.stdout)
    assert (report.python_info, report.project, report.setup) == (python, project, setup)
