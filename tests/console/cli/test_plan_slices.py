"""`tpu-console plan --type T --slices N`: the planner asked for N slices, its answer cached apart from one
slice's, its DCN lines printed; --slices where it cannot go is one line. The planner is a stand-in script in
place of `python -m trainer plan`, so these take no compiler time (tests/trainer/test_dcn.py compiles)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.console.launch.test_local import fake_trainer, run
from tests.fixtures_cli import console_home  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("console_home")


def test_plan_for_several_slices_asks_the_planner_for_them(tmp_path, capsys, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text("model_path: Qwen/Qwen2.5-0.5B-Instruct\nsteps: 1\n")
    calls = tmp_path / "calls"
    net = {"slices": 2, "decode_steps": 1024, "ici_bytes_per_chip": 4e9, "ici_s": [0.1, 0.3],
           "dcn_bytes_per_chip": 8e8, "dcn_bytes_per_host": 3.2e9, "dcn_s": [0.064, 0.07],
           "dcn_gbps_per_chip": [100, 100], "dcn_bandwidth_assumed": False}
    plan = {"accelerator_type": "v6e-16", "slices": 2, "topology": "v6e:4x4", "hosts": 4, "chips": 16,
            "hbm_bytes": 32 * 2**30, "model_source": "preset", "mesh": {"dp": 2, "fsdp": 16, "tp": 1},
            "weight_layout": "fsdp", "resident_bytes": {}, "programs": [], "verdict": "fits: peak 1.00 GiB",
            "peak_bytes": 2**30, "network_step": net}
    planner = fake_trainer(tmp_path, f"echo \"$@\" >> {calls}\necho '{json.dumps(plan)}'\n")
    monkeypatch.setattr(sys, "executable", planner)
    status, out, err = run(capsys, "plan", "--type", "v6e-16", "--slices", "2", "--config", str(config))
    assert status == 0, err
    argv = calls.read_text().splitlines()[-1].split()
    assert argv[argv.index("--slices") + 1] == "2"
    assert out.startswith("plan for 2 x v6e-16 (v6e:4x4 each: 4 hosts, 16 chips")
    assert "DCN across 2 slices 0.800 GB (3.200 GB a host), 0.064..0.07 s at 100 Gbps a chip" in out
    # One slice is another plan (not the cached answer for two), asked without --slices.
    status, _, err = run(capsys, "plan", "--type", "v6e-16", "--config", str(config))
    assert status == 0, err
    assert len(calls.read_text().splitlines()) == 2 and "--slices" not in calls.read_text().splitlines()[-1]


@pytest.mark.parametrize("argv", [["pod", "--slices", "2"], ["--type", "v6e-16", "--slices", "0"]])
def test_slices_where_they_cannot_go_is_one_line(tmp_path, capsys, argv):
    config = tmp_path / "c.yaml"
    config.write_text("model_path: Qwen/Qwen2.5-0.5B-Instruct\nsteps: 1\n")
    status, _, err = run(capsys, "plan", *argv, "--config", str(config))
    assert status == 2
    assert err.strip().splitlines()[-1].startswith("error: --slices N goes with --type T")
