"""Experiments on a local pod through the CLI: the FSDP memory bench across workers."""

from __future__ import annotations

import json

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.test_runs_local import run

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
