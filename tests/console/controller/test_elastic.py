"""Slices that shrink and grow (controller/elastic.py): which jobs may, when a node has slices left or is
whole again, and the controller's loop doing it on a local multislice pod: slice 0 preempted alone, the
managed run on both slices is stopped (it checkpoints on its SIGTERM) and goes on on slice 1 at once, told
its one slice; the controller makes slice 0 again, and once the run on slice 1 made a step it grows back
to both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.console.controller.test_invariants import drive
from tests.console.launch.test_local import worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.controller import elastic
from tpu_console.controller.handover import Budgets, hand_over
from tpu_console.controller.loop import Controller
from tpu_console.controller.relaunch import job_of_command
from tpu_console.controller.store import FolderStore
from tpu_console.domain import AcceleratorShape, CreateRequest, Node, NodeState
from tpu_console.errors import UserError
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.start import launch
from tpu_console.observe.supervision import SupervisionPolicy
from tpu_console.providers.local.jobs import running_job_groups, stop_groups
from tpu_console.providers.local.provider import LocalProvider

pytestmark = pytest.mark.usefixtures("console_home")

R, P, T, C = NodeState.READY, NodeState.PREEMPTED, NodeState.TERMINATED, NodeState.CREATING


def node(*states: NodeState) -> Node:
    worst = next((s for s in states if s != R), R)
    return Node("ms", "gcp", AcceleratorShape("v6e-16", 4 * len(states), 4, 16 * len(states)), worst,
                slices=len(states), slice_states=tuple(str(s) for s in states))


def test_which_slices_are_left_and_when_the_node_is_whole_again():
    assert elastic.slices_left(node(R, P, R)) == (0, 2)
    assert elastic.slices_left(node(T, R)) == (1,)
    assert elastic.slices_left(node(R, R)) is None  # nothing lost
    assert elastic.slices_left(node(P, P)) is None  # nothing left: a recovery of the whole node
    assert elastic.slices_left(node(R, P, C)) is None  # a slice on its way: wait for it
    assert elastic.grown_back(node(R, R, R), on=(0, 2))
    assert not elastic.grown_back(node(R, C, R), on=(0, 2))
    assert not elastic.grown_back(node(R, R, R), on=(0, 1, 2))


def test_the_trainer_is_elastic_and_a_command_only_when_its_job_file_says_so():
    policy = SupervisionPolicy()
    assert elastic.elastic({"kind": "trainer"})
    assert elastic.elastic(job_of_command(JobSpec(command=["x"], elastic=True), None, policy))
    assert not elastic.elastic(job_of_command(JobSpec(command=["x"]), None, policy))


JOB = """\
import json, os, signal, sys, time
run = os.environ["TPU_CONSOLE_RUN_DIR"]
def checkpoint(signum, frame):
    open(os.path.join(run, "checkpointed"), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, checkpoint)
print(json.dumps({k: os.environ[k] for k in ("MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID",
                                             "TPU_CONSOLE_NUM_SLICES")}), flush=True)
open(os.path.join(run, "ready"), "w").close()
with open(os.path.join(run, "events.jsonl"), "a") as events:
    events.write(json.dumps({"t": time.time(), "kind": "step", "process": 0, "step": 1}) + "\\n")
while True:
    time.sleep(0.05)
"""


def run_folder(worker: int, run_id: str) -> Path:
    return worker_home(worker, "ms") / "tpu-console" / "runs" / run_id


def env_of(worker: int, run_id: str) -> dict:
    wait_for(lambda: (run_folder(worker, run_id) / "ready").exists(), timeout=60)
    return json.loads((run_folder(worker, run_id) / "output.log").read_text().splitlines()[0])


async def test_a_managed_run_goes_on_on_the_slice_left_and_grows_back_once_it_is_made_again(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    provider = LocalProvider()
    providers = {"local": provider}
    spec = JobSpec(command=[sys.executable, str(script)], elastic=True)
    job = job_of_command(spec, None, SupervisionPolicy())
    store = FolderStore(tmp_path / "controller")
    controller = Controller(providers, store, poll_s=0.1, read_timeout_s=30.0)
    try:
        await provider.create(CreateRequest(name="ms", accelerator_type="local-1x1", slices=2))
        first = await launch(providers, "ms", job=spec)
        assert [env_of(w, first.run_id)["MEGASCALE_NUM_SLICES"] for w in range(2)] == ["2"] * 2
        managed = hand_over(store, first, job, [], Budgets(confirm_s=0.3))

        # slice 0 lost: the run goes on on slice 1 alone, its host told of one slice
        await provider.preempt("ms", slice_index=0)
        run = await drive(controller, lambda r: len(r.incarnations) == 2 and r.current.run_id, managed.id,
                          store)
        shrunk = run.current
        assert shrunk.slices == [1] and run.recoveries[0].reason == "slice 0 preempted"
        assert (run_folder(1, first.run_id) / "checkpointed").exists()  # its SIGTERM, then a save
        assert env_of(1, shrunk.run_id) == {"MEGASCALE_NUM_SLICES": "1", "MEGASCALE_SLICE_ID": "0",
                                            "TPU_CONSOLE_NUM_SLICES": "1"}
        assert not run_folder(0, shrunk.run_id).exists()

        # the controller makes slice 0 again; the run on slice 1 made a step: both slices again
        run = await drive(controller, lambda r: len(r.incarnations) == 3 and r.current.run_id, managed.id,
                          store)
        grown = run.current
        assert grown.slices is None and run.incarnations[1].ended == "every slice READY again: from 1 to 2"
        assert (run_folder(1, shrunk.run_id) / "checkpointed").exists()
        assert [env_of(w, grown.run_id)["MEGASCALE_SLICE_ID"] for w in range(2)] == ["0", "1"]
        assert {env_of(w, grown.run_id)["TPU_CONSOLE_NUM_SLICES"] for w in range(2)} == {"2"}
        assert len(run.recoveries) == 1 and run.status == "RUNNING"  # a grow is no recovery

        rigid = job_of_command(JobSpec(command=[sys.executable, str(script)]), None, SupervisionPolicy())
        with pytest.raises(UserError, match="without `elastic = true`: it runs on every slice or not at all"):
            await elastic.relaunch_on_slices(providers, "managed-2", "ms", rigid, (1,), grown.run_id)
    finally:
        await controller.stop()
        stop_groups([g for w in range(2) for g in running_job_groups(worker_home(w, "ms"))], grace_s=1.0)
        await provider.close()
