"""A local multislice (2 slices of a local type, one node): create, ls and delete as one thing; a command
launched on every host of every slice with the slice id, slice count and slice 0's coordinator
(MEGASCALE_*) beside the jax.distributed variables; bad --slices input; and the real tiny trainer run on
2 slices with data parallelism over the slices (the DCN axis)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.console.runs.test_local import run, worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.runs.store import RunStore
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")

SHOW_ENV = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith(('MEGASCALE_', 'TPU_CONSOLE_PROCESS_ID', 'TPU_CONSOLE_NUM_PROCESSES'))}))")


def follow(capsys, node: str, run_id: str) -> tuple[int, dict[int, list[str]]]:
    status, out, _ = run(capsys, "logs", node, run_id, "--follow", "--lines", "all")
    lines: dict[int, list[str]] = {}
    for line in out.splitlines():
        worker, _, text = line.partition("] ")
        lines.setdefault(int(worker[1:]), []).append(text)
    return status, lines


def test_create_ls_launch_and_delete_a_local_multislice(capsys):
    status, out, err = run(capsys, "create", "ms", "--type", "local-2x1", "--slices", "2",
                           "--provider", "local")
    assert status == 0, err
    assert "x 2 slices (ms-0, ms-1), 4 workers" in out
    status, out, _ = run(capsys, "ls", "--json")
    [node] = json.loads(out)["nodes"]
    assert node["slices"] == 2 and node["slice_names"] == ["ms-0", "ms-1"] and node["workers"] == 4
    assert [h["slice"] for h in node["hosts"]] == [0, 0, 1, 1]
    status, out, _ = run(capsys, "ls")
    assert "2x local-2x1" in out

    status, out, err = run(capsys, "launch", "ms", "--json", "--", sys.executable, "-c", SHOW_ENV)
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    status, lines = follow(capsys, "ms", run_id)
    assert status == 0 and sorted(lines) == [0, 1, 2, 3]  # every host of every slice
    envs = {w: json.loads(lines[w][-1]) for w in lines}
    assert [envs[w]["MEGASCALE_SLICE_ID"] for w in range(4)] == ["0", "0", "1", "1"]
    assert [envs[w]["TPU_CONSOLE_PROCESS_ID"] for w in range(4)] == ["0", "1", "2", "3"]
    assert {envs[w]["MEGASCALE_NUM_SLICES"] for w in envs} == {"2"}
    assert {envs[w]["TPU_CONSOLE_NUM_PROCESSES"] for w in envs} == {"4"}
    assert {envs[w]["MEGASCALE_COORDINATOR_ADDRESS"] for w in envs} == {"127.0.0.1"}
    assert {envs[w]["MEGASCALE_PORT"] for w in envs} == {"8080"}

    # one slice alone is a partial launch: refused before anything starts
    runs_before = len(RunStore().list())
    status, _, err = run(capsys, "launch", "ms", "--worker", "0,1", "--", sys.executable, "-c", "pass")
    assert status == 2 and err.count("\n") == 1
    assert "every host of every slice; leave out --worker" in err
    assert len(RunStore().list()) == runs_before

    status, _, err = run(capsys, "delete", "ms", "--yes")
    assert status == 0, err
    assert not worker_home(3, "ms").exists() and not worker_home(0, "ms").exists()
    status, out, _ = run(capsys, "ls", "--json")
    assert json.loads(out)["nodes"] == []


@pytest.mark.parametrize("argv, words", [
    (["--type", "v3-8", "--slices", "2", "--provider", "gcp"], "v3-8 has no Multislice"),
    (["--type", "v2-8", "--slices", "2", "--provider", "gcp"], "v2-8 has no Multislice"),
    (["--type", "v6e-16", "--slices", "2", "--provider", "gcp", "--direct"], "leave out --direct"),
    (["--type", "v6e-16", "--slices", "2", "--provider", "gcp"], "--slices 2 on gcp is not supported yet"),
    (["--type", "local-2x1", "--slices", "0", "--provider", "local"], "--slices 0"),
    (["--type", "local-512x1", "--slices", "4", "--provider", "local"], "more than 1024"),
])
def test_bad_slices_are_refused_before_anything_is_made(capsys, argv, words):
    status, _, err = run(capsys, "create", "bad", *argv)
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert words in err
    status, out, _ = run(capsys, "ls", "--json", "--provider", "local")
    assert json.loads(out)["nodes"] == []


def test_a_mesh_that_cannot_span_the_slices_is_refused_at_launch(capsys, tmp_path, tiny_model_dir):
    assert run(capsys, "create", "ms", "--type", "local-1x2", "--slices", "2", "--provider", "local")[0] == 0
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 16, seed=0)
    status, _, err = run(capsys, "launch", "ms", "--config", str(CONFIG), "--set",
                         f"model_path={tiny_model_dir}", "--set", f"data.path={data}",
                         "--set", "mesh_shape=1,-1,1")
    assert status == 2 and err.count("\n") == 1, err
    assert "dp=1, which cannot span 2 slices" in err and "2 slices, 2 worker(s) x 2 devices" in err
    assert RunStore().list() == []


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_tiny_trainer_on_two_local_slices(capsys, tmp_path, tiny_model_dir):
    """2 slices x 1 host x 2 CPU devices: jax.distributed over both processes, mesh_shape auto puts dp=2 on
    the slices (the outer axis) and fsdp inside each slice, and the run ends well."""
    assert run(capsys, "create", "ms", "--type", "local-1x2", "--slices", "2", "--provider", "local")[0] == 0
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 16, seed=0)
    status, out, err = run(capsys, "launch", "ms", "--config", str(CONFIG), "--json",
                           "--set", f"model_path={tiny_model_dir}", "--set", f"data.path={data}",
                           "--set", "steps=1", "--set", "eval_every_steps=0",
                           "--set", "rollout.global_length=64", "--set", "rollout.max_length_sample=8")
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    status, out, _ = run(capsys, "logs", "ms", run_id, "--follow", "--lines", "all")
    assert status == 0, out[-3000:]
    for worker in (0, 1):
        folder = worker_home(worker, "ms") / "tpu-console" / "runs" / run_id
        events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
        start = events[0]
        assert start["process_count"] == 2 and start["device_count"] == 4
        assert start["mesh_axes"] == {"dp": 2, "fsdp": 2, "tp": 1} and start["fsdp_spans_hosts"] is False
        assert events[-1]["kind"] == "end"


CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"
