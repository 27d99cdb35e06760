"""Experiments on a local pod through the CLI: the FSDP memory bench across workers."""

from __future__ import annotations

import json

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.test_runs_local import CONFIG, run
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.fixtures_trainer",)

pytestmark = pytest.mark.usefixtures("console_home")


@pytest.fixture
def pod2x2(capsys) -> str:
    assert run(capsys, "create", "pod", "--type", "local-2x2")[0] == 0
    return "pod"


@pytest.mark.slow
def test_bench_memory_on_every_worker_matches_fsdp(capsys, pod2x2):
    status, out, err = run(capsys, "bench-memory", "pod", "--target-bytes-gib", "0.01", "--cols", "512", "--json")
    assert status == 0, err
    cases = {(c["mesh_shape"], c["mode"]): c for c in json.loads(out)["cases"]}
    assert set(cases) == {("auto", "sharded"), ("auto", "gather"), ("host_local", "sharded"), ("host_local", "gather")}
    for (shape, mode), case in cases.items():
        bench = case["bench"]
        fsdp = {"auto": 4, "host_local": 2}[shape]
        assert bench["mesh_axes"]["fsdp"] == fsdp
        want = bench["total_bytes"] // fsdp if mode == "sharded" else bench["total_bytes"]
        assert bench["per_device_array_bytes_max"] == want and case["matches_prediction"] is True
        assert bench["bytes_in_use_max"] is None  # CPU: not reported, never invented


def test_bench_memory_refuses_a_mesh_that_does_not_fit_before_running(capsys, pod2x2):
    status, _, err = run(capsys, "bench-memory", "pod", "--mesh-shape", "3,-1,1")
    assert status == 2 and "mesh_shape: 3,-1,1 cannot fill 4 devices" in err and err.count("\n") == 1
    status, _, err = run(capsys, "bench-memory", "pod", "--mode", "scatter")
    assert status == 2 and "unknown mode 'scatter'" in err


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_finds_the_largest_batch_under_a_simulated_memory_limit(capsys, tmp_path, tiny_model_dir):
    assert run(capsys, "create", "one", "--type", "local-1x2")[0] == 0
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    # rollout.n = 4: local batch = 4 x batch_size; the simulated limit lets 8 sequences through, not 12.
    sets = [f"model_path={tiny_model_dir}", f"data.path={data}", "rollout.global_length=64",
            "rollout.max_length_sample=8", "debug_max_local_batch=8"]
    argv = ["sweep", "one", "--config", str(CONFIG), "--steps", "1", "--max", "8", "--json"]
    for item in sets:
        argv += ["--set", item]
    status, out, err = run(capsys, *argv)
    assert status == 0, err[-3000:]
    result = json.loads(out)
    assert (result["largest_fit"], result["first_oom"]) == (2, 3)
    trials = {t["value"]: t for t in result["trials"]}
    assert trials[4]["outcome"] == "oom" and trials[4]["local_batch"] == 16  # the config's value first
    assert trials[2]["outcome"] == "fits" and trials[3]["outcome"] == "oom"
    assert all(t["peak_gib"] is None for t in trials.values())  # CPU: not reported
    status, listing, _ = run(capsys, "runs", "one", "--json")
    assert {r["run_id"] for r in json.loads(listing)["runs"]} == {t["run_id"] for t in trials.values()}
