"""`tpu-console plan` without a compile: what it says when libtpu is absent (once, not twice), and the
decode loop priced at the lengths earlier runs of the same config measured. The planner is a stand-in
script in place of `python -m trainer plan`, so these take no compiler time."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import pytest

from tests.console.launch.test_local import fake_trainer, run
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.experiments.planning import measured_longest_rows
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.launch.job_kinds import validate_config

pytestmark = pytest.mark.usefixtures("console_home")


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "c.yaml"
    path.write_text("model_path: Qwen/Qwen2.5-0.5B-Instruct\nsteps: 1\n")
    return str(path)


def test_without_libtpu_plan_says_cannot_plan_here_once(tmp_path, config, capsys, monkeypatch):
    planner = fake_trainer(
        tmp_path,
        "echo 'error: cannot plan here: libtpu is not installed; pip install \"jax[tpu]==0.10.2\"' >&2\n"
        "exit 3\n",
    )
    monkeypatch.setattr(sys, "executable", planner)
    status, _, err = run(capsys, "plan", "--type", "v6e-8", "--config", config)
    assert status == 3
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: cannot plan here: libtpu is not installed")
    assert lines[-1].count("cannot plan here") == 1 and "pip install" in lines[-1]
    # The launch form's line says it once too.
    from tpu_console.experiments.planning import PlanOutcome

    summary = PlanOutcome("v6e-8", "unavailable", "libtpu is not installed; pip install ...").summary()
    assert summary == "v6e-8: cannot plan here: libtpu is not installed; pip install ..."


def _archived_run(home, run_id: str, digest: str, longest: list[int]) -> None:
    folder = home / "archive" / run_id / "worker-0"
    folder.mkdir(parents=True)
    events = [{"kind": "start", "t": 0.0}] + [
        {"kind": "step", "t": float(i), "step": i + 1, "train/completion_length/max": n}
        for i, n in enumerate(longest)
    ]
    (folder / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    store = RunStore()
    started = datetime.now(UTC)
    store.add(RunRecord(run_id, "pod", "gcp", "v6e-16", [0], "c.yaml", digest, [], "python3", started))
    store.set_summary(run_id, archive_path=str(folder.parent))


def test_the_decode_loop_is_priced_at_the_longest_rows_of_earlier_runs_of_the_config(
    tmp_path, config, capsys, monkeypatch, console_home  # noqa: F811 - the fixture's value
):
    digest = validate_config(config, []).digest
    assert measured_longest_rows(digest) == []  # no history: the planner prices the maximum
    _archived_run(console_home, "run-a", digest, [300, 512])
    _archived_run(console_home, "run-b", "another-config", [1024])
    assert sorted(measured_longest_rows(digest)) == [300, 512]

    argv_file = tmp_path / "argv"
    plan = {"verdict": "fits: peak 1.00 GiB", "peak_bytes": 2**30, "hbm_bytes": 32 * 2**30}
    planner = fake_trainer(tmp_path, f"echo \"$@\" > {argv_file}\necho '{json.dumps(plan)}'\n")
    monkeypatch.setattr(sys, "executable", planner)
    status, out, err = run(capsys, "plan", "--type", "v6e-16", "--config", config, "--json")
    assert status == 0, err
    argv = argv_file.read_text().split()
    assert argv[argv.index("--longest-rows") + 1] in ("300,512", "512,300")
