"""`tpu-console plan`, the plan check `launch` makes, and `sweep --compile-only`, on a local pod that
rehearses a v6e-8 (1 worker x 8 devices) with the tiny model: libtpu compiles for the TPU type on this
machine. Each planner run costs 10-30 s on 2 cores, so these are few."""

from __future__ import annotations

import json
import time

import pytest

from tests.console.launch.test_local import fake_trainer, run, worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.trainer.launch import planning_config
from trainer.planner import tpu_compile

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")
needs_libtpu = pytest.mark.skipif(tpu_compile.libtpu_version() is None, reason="libtpu is not installed")


@pytest.fixture
def pod(capsys) -> str:
    status, _, err = run(capsys, "create", "pod", "--type", "local-v6e-8")
    assert status == 0, err
    return "pod"


@needs_libtpu
def test_plan_of_a_node_fits_and_the_second_answer_comes_from_the_cache(
    pod, tmp_path, tiny_model_dir, capsys
):
    config = planning_config(tmp_path, tiny_model_dir)
    status, out, err = run(capsys, "plan", pod, "--config", config, "--json")
    assert status == 0, err
    first = json.loads(out)
    assert first["status"] == "fits" and first["tpu_type"] == "v6e-8" and not first["cached"]
    assert first["plan"]["fits"] and first["plan"]["chips"] == 8

    started = time.monotonic()
    status, out, _ = run(capsys, "plan", pod, "--config", config, "--json")
    assert status == 0 and json.loads(out)["cached"] is True
    assert time.monotonic() - started < 5  # no compiler run

    status, out, err = run(capsys, "plan", "--type", "v6e-8", "--config", config)  # the table, from the cache
    assert status == 0, err
    assert out.startswith("plan for v6e-8") and "decode loop" in out
    assert out.strip().splitlines()[-1].startswith("fits: peak")


@needs_libtpu
def test_launch_refuses_a_config_the_compiler_cannot_fit_before_anything_is_sent(
    pod, tmp_path, tiny_model_dir, capsys
):
    # Too long a sequence rather than too many: the compiler refuses the first program (prefill) at once,
    # where 4096 sequences of 4096 tokens cost it twice as long to refuse.
    config = planning_config(
        tmp_path, tiny_model_dir, batch_size=8, n=2, global_length=65536, max_length_sample=64
    )
    python = fake_trainer(tmp_path, "echo started\n")
    status, out, err = run(capsys, "launch", pod, "--config", config, "--python", python)
    assert status == 2 and out == ""
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "does not fit" in error[0] and "nothing was launched" in error[0]
    assert "--no-plan-check" in error[0]
    assert not (worker_home(0) / "tpu-console" / "runs").exists()  # no run folder on the worker

    # --no-plan-check goes past the check (whatever the launch does next).
    status, out, err = run(capsys, "launch", pod, "--config", config, "--python", python, "--no-plan-check")
    assert "does not fit" not in err and "nothing was launched" not in err


def test_plan_for_a_shape_no_tpu_has_is_one_line(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("model_path: Qwen/Qwen2.5-0.5B-Instruct\nsteps: 1\n")
    status, out, err = run(capsys, "plan", "--type", "local-2x4", "--config", str(config))
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: local-2x4 is not a TPU type")
    status, _, err = run(capsys, "plan", "ghost", "--config", str(config))
    assert status == 2 and err.count("\n") == 1 and "unknown node 'ghost'" in err


@needs_libtpu
def test_sweep_compile_only_needs_no_pod(tmp_path, tiny_model_dir, capsys):
    config = planning_config(tmp_path, tiny_model_dir)
    argv = ["sweep", "--compile-only", "--type", "v6e-8", "--config", config, "--limit", "4", "--json"]
    status, out, err = run(capsys, *argv)
    assert status == 0, err
    result = json.loads(out)
    assert result["largest_fit"] == 4 and result["largest_local_batch"] == 16
    assert [t["value"] for t in result["trials"]] == [4]
