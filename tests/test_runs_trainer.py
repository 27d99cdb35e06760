"""The real trainer launched by the console on a local 2x2 pod (2 workers x 2 CPU devices, jax.distributed
across them): every worker runs to the end, writes its `end` event and exits 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console import cli
from tpu_console.locations import home
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.fixtures_trainer",)
pytestmark = [pytest.mark.usefixtures("console_home"), pytest.mark.slow]

CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "tiny_local.yaml"


@pytest.mark.timeout(300)
def test_tiny_trainer_runs_on_every_worker_of_a_local_pod(capsys, tmp_path, tiny_model_dir):
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    assert cli.main(["create", "pod", "--type", "local-2x2"]) == 0
    overrides = [f"model_path={tiny_model_dir}", f"data.path={data}", "steps=1", "eval_every_steps=0",
                 "rollout.global_length=64", "rollout.max_length_sample=8"]
    argv = ["launch", "pod", "--config", str(CONFIG), "--json"]
    for override in overrides:
        argv += ["--set", override]
    capsys.readouterr()
    assert cli.main(argv) == 0
    launched = json.loads(capsys.readouterr().out)
    run_id = launched["run_id"]

    status = cli.main(["logs", run_id, "--follow", "--lines", "all"])
    out, err = capsys.readouterr()
    assert status == 0, out[-3000:] + err[-2000:]
    for worker in (0, 1):
        assert any(line.startswith(f"[{worker}] step=1 ") for line in out.splitlines())
        folder = home() / "local" / "pod" / "workers" / str(worker) / "tpu-console" / "runs" / run_id
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        assert events[0]["kind"] == "start" and events[0]["process_count"] == 2
        assert events[-1]["kind"] == "end" and events[-1]["process"] == worker
        assert (folder / "exit").read_text().strip() == "0"

    assert cli.main(["status", run_id, "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["state"] == "succeeded"
    digests = {w["config_digest"] for w in view["worker_status"]}
    assert digests == {launched["config_digest"]}  # every process ran the config the console sent
    assert [w["last_step"]["step"] for w in view["worker_status"]] == [1, 1]
