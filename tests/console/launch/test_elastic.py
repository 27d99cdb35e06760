"""Slices that shrink and grow, on local multislice pods: a run launched on some of a node's slices
(`launch(..., slices=...)`) runs on every host of those slices only, as a run of that many slices, with every
MEGASCALE variable rewritten for them (nothing of the node's own count left); a command only when its job
is elastic; and the tiny trainer on 2 slices goes on on the one left, from its checkpoint, with the same
global batch, then grows back to both."""

from __future__ import annotations

import json
import sys

import pytest

from tests.console.launch.test_local import CONFIG, worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.domain import CreateRequest
from tpu_console.errors import UserError
from tpu_console.history.store import RunStore
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.start import launch
from tpu_console.providers.local.provider import LocalProvider
from trainer.synthetic_gsm8k import write_jsonl

pytest_plugins = ("tests.trainer.fixtures",)
pytestmark = pytest.mark.usefixtures("console_home")

SHOW_ENV = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith("
            "('MEGASCALE_', 'TPU_CONSOLE_NUM_', 'TPU_CONSOLE_PROCESS_ID', 'TPU_CONSOLE_WORKER'))}))")


def folder(worker: int, run_id: str, node: str = "ms"):
    return worker_home(worker, node) / "tpu-console" / "runs" / run_id


def printed_env(worker: int, run_id: str) -> dict:
    path = folder(worker, run_id) / "output.log"
    wait_for(lambda: (folder(worker, run_id) / "exit").exists(), timeout=60)
    return json.loads(path.read_text().strip().splitlines()[-1])


async def test_a_run_on_some_slices_gets_every_megascale_variable_for_them_alone():
    provider = LocalProvider()
    providers = {"local": provider}
    elastic = JobSpec(command=[sys.executable, "-c", SHOW_ENV], elastic=True)
    try:
        await provider.create(CreateRequest(name="ms", accelerator_type="local-2x1", slices=3))
        result = await launch(providers, "ms", job=elastic, slices=[0, 2])  # slice 1 lost
        assert result.ok and result.workers == [0, 1, 4, 5]
        envs = {w: printed_env(w, result.run_id) for w in result.workers}
        assert {w: e["MEGASCALE_SLICE_ID"] for w, e in envs.items()} == {0: "0", 1: "0", 4: "1", 5: "1"}
        assert {e["MEGASCALE_NUM_SLICES"] for e in envs.values()} == {"2"}
        assert {e["TPU_CONSOLE_NUM_SLICES"] for e in envs.values()} == {"2"}
        assert {e["TPU_CONSOLE_NUM_PROCESSES"] for e in envs.values()} == {"4"}
        assert [envs[w]["TPU_CONSOLE_PROCESS_ID"] for w in (0, 1, 4, 5)] == ["0", "1", "2", "3"]
        assert {e["MEGASCALE_COORDINATOR_ADDRESS"] for e in envs.values()} == {"127.0.0.1"}
        record = RunStore().get(result.run_id)
        assert (record.slices, record.workers) == (2, [0, 1, 4, 5])
        assert not folder(2, result.run_id).exists()  # the lost slice's hosts are not touched

        one = await launch(providers, "ms", job=elastic, slices=[1])  # one slice left: still rewritten
        assert one.workers == [2, 3]
        env = printed_env(2, one.run_id)
        assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_SLICE_ID"], env["TPU_CONSOLE_NUM_SLICES"]) == (
            "1", "0", "1")
        assert env["MEGASCALE_PORT"] != envs[0]["MEGASCALE_PORT"]  # a fresh port, not the last run's

        with pytest.raises(UserError, match=r"not elastic: it runs on some of a node's slices only when its "
                                            r"job file says `elastic = true`"):
            await launch(providers, "ms", job=JobSpec(command=[sys.executable, "-c", "pass"]), slices=[0])
        refused = (([3], r"has slices 0..2, not \[3\]"), ([2, 0], "give each slice once, in order"))
        for slices, words in refused:
            with pytest.raises(UserError, match=words):
                await launch(providers, "ms", job=elastic, slices=slices)
    finally:
        await provider.close()


def events(worker: int, run_id: str) -> list[dict]:
    return [json.loads(line) for line in (folder(worker, run_id) / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(1500)
async def test_the_tiny_trainer_shrinks_to_the_slice_left_and_grows_back_from_its_checkpoints(
        tmp_path, tiny_model_dir):
    """2 slices x 1 host x 2 CPU devices: 2 steps on both, then slice 0 is lost and the run goes on on slice
    1 alone (1 process, dp=1) from step 2's checkpoint, the global batch the same; then both again."""
    provider = LocalProvider()
    providers = {"local": provider}
    data = write_jsonl(tmp_path / "gsm8k.jsonl", 32, seed=0)
    sets = [f"model_path={tiny_model_dir}", f"data.path={data}", "eval_every_steps=0",
            "rollout.global_length=64", "rollout.max_length_sample=8", f"checkpoint.dir={tmp_path}/ckpt",
            "checkpoint.every_steps=1"]
    env = tmp_path / "cache.env"  # the grown run loads the programs the first one compiled
    env.write_text(f"TRAINER_COMPILATION_CACHE={tmp_path}/jax-cache\n")
    try:
        await provider.create(CreateRequest(name="ms", accelerator_type="local-1x2", slices=2))
        starts = {}
        for steps, slices in ((2, None), (3, [1]), (4, [0, 1])):
            result = await launch(providers, "ms", CONFIG, [*sets, f"steps={steps}"], str(env), slices=slices,
                                  check_ports=False)
            assert result.ok
            for worker in result.workers:
                done = folder(worker, result.run_id) / "exit"
                wait_for(done.exists, timeout=450, poll=0.5)  # a compile takes minutes on a busy machine
                log = (folder(worker, result.run_id) / "output.log").read_text()
                assert (folder(worker, result.run_id) / "exit").read_text().strip() == "0", log[-3000:]
            seen = events(result.workers[0], result.run_id)
            starts[steps] = (result.workers, seen[0], [e["step"] for e in seen if e["kind"] == "step"],
                             [e.get("resumed_step") for e in seen if e.get("resumed_step")])
        workers, start, steps, resumed = starts[2]
        assert workers == [0, 1] and start["process_count"] == 2 and start["mesh_axes"]["dp"] == 2
        assert steps == [1, 2] and resumed == []
        workers, start, steps, resumed = starts[3]  # slice 1 alone
        assert workers == [1] and start["process_count"] == 1 and start["mesh_axes"] == {"dp": 1, "fsdp": 2,
                                                                                          "tp": 1}
        assert start["global_batch"] == starts[2][1]["global_batch"] == 16  # the same, accumulated
        assert steps == [3] and resumed == [2]
        workers, start, steps, resumed = starts[4]  # grown back
        assert workers == [0, 1] and start["process_count"] == 2 and start["mesh_axes"]["dp"] == 2
        assert steps == [4] and resumed == [3]
    finally:
        await provider.close()
