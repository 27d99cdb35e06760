"""Slices that shrink and grow (controller/elastic.py): which jobs may, when a node has slices left or is
whole again, and the controller's loop doing it on a local multislice pod: slice 0 preempted alone, the
managed run on both slices is stopped (it checkpoints on its SIGTERM) and goes on on slice 1 at once, told
its one slice; the controller makes slice 0 again, and once the run on slice 1 made a step it grows back
to both. A grow that fails (its run fails before its first step, or its launch fails) puts the run back
on the slice it was on, and is tried again after a back-off, within a limit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.console.controller.test_invariants import drive
from tests.console.launch.test_local import worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.controller import elastic, relaunch
from tpu_console.controller import state as st
from tpu_console.controller.handover import Budgets, hand_over
from tpu_console.controller.judge import judge
from tpu_console.controller.loop import Controller
from tpu_console.controller.observe import NodeReading, RunReading
from tpu_console.controller.relaunch import job_of_command
from tpu_console.controller.state import Incarnation, ManagedRun, Recovery
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


def two_slice_run(*incarnations: Incarnation, recoveries: tuple[Recovery, ...] = ()) -> ManagedRun:
    return ManagedRun(id="m1", provider="local", node="ms", accelerator_type="v6e-16",
                      job={"kind": "trainer"}, slices=2, incarnations=list(incarnations),
                      recoveries=list(recoveries))


def test_a_grown_run_that_fails_before_its_first_step_goes_back_and_grows_again_after_a_back_off():
    whole = Incarnation(0, "ms", first_step_at=1.0)
    shrunk = Incarnation(1, "ms", slices=[1], first_step_at=5.0)
    grown = Incarnation(2, "ms", run_id="r2", started_at=10.0)
    run = two_slice_run(whole, shrunk, grown, recoveries=(Recovery(1, "slice 0 preempted", 4.0),))
    assert elastic.on_trial(run) and elastic.before_grow(run) == (1,)
    verdict = judge(run, NodeReading(20.0, node=node(R, R)), RunReading(20.0, state="failed"))
    assert (verdict.action, verdict.slices) == ("back", (1,))
    assert verdict.reason == "the run on 2 slices failed before its first step"
    a_shrink = two_slice_run(whole, Incarnation(1, "ms", slices=[1]),
                             recoveries=(Recovery(1, "slice 0 preempted", 4.0),))
    assert not elastic.on_trial(a_shrink)

    # back on slice 1: the next grow is due GROW_BACKOFF_S after the failure, then twice that, then never
    grown.ended, grown.ended_at = f"{elastic.GROW_FAILED}: it broke", 20.0
    run.incarnations.append(Incarnation(3, "ms", slices=[1], first_step_at=30.0))
    assert not elastic.on_trial(run) and elastic.next_grow_at(run) == 20.0 + elastic.GROW_BACKOFF_S
    assert "failed 1 of 3 time(s), last: it broke; on 1 of 2 slices, next try from" in elastic.grow_note(run)
    early = NodeReading(20.0 + elastic.GROW_BACKOFF_S - 1, node=node(R, R))
    assert judge(run, early, RunReading(early.at, state="running")).action == "wait"
    due = NodeReading(20.0 + elastic.GROW_BACKOFF_S, node=node(R, R))
    assert judge(run, due, RunReading(due.at, state="running")).action == "grow"
    for n in (4, 6):
        run.incarnations += [Incarnation(n, "ms", ended=f"{elastic.GROW_FAILED}: again", ended_at=100.0 * n),
                             Incarnation(n + 1, "ms", slices=[1], first_step_at=100.0 * n + 1)]
    assert elastic.next_grow_at(run) is None and "no more tries: it stays on them" in elastic.grow_note(run)
    later = NodeReading(10**9, node=node(R, R))
    assert judge(run, later, RunReading(later.at, state="running")).action == "wait"
    run.incarnations.append(Incarnation(8, "ms", first_step_at=900.0))  # a whole run made a step again
    assert elastic.next_grow_at(run) == 0.0 and elastic.grow_note(run) is None


JOB = """\
import json, os, signal, sys, time
run = os.environ["TPU_CONSOLE_RUN_DIR"]
if os.environ["TPU_CONSOLE_NUM_SLICES"] == "2" and os.path.exists(os.environ.get("FAIL_ON_TWO", "-")):
    sys.exit(3)  # as a host that cannot join the others' first collective
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


async def test_a_grow_that_fails_leaves_the_run_on_the_slice_left_and_is_tried_again_later(tmp_path,
                                                                                          monkeypatch):
    """Slice 0 lost and made again: the grow's run on both slices fails before its first step, then the
    next grow's launch fails; each time the run goes on on slice 1 (no recovery, no end), the record and
    the webhook say why, and the third grow, once the back-off let it, holds."""
    script, fail_on_two = tmp_path / "job.py", tmp_path / "fail-on-two"
    script.write_text(JOB)
    monkeypatch.setattr(elastic, "GROW_BACKOFF_S", 3600.0)
    provider = LocalProvider()
    providers = {"local": provider}
    spec = JobSpec(command=[sys.executable, str(script)], elastic=True, env={"FAIL_ON_TWO": str(fail_on_two)})
    job = job_of_command(spec, None, SupervisionPolicy())
    store = FolderStore(tmp_path / "controller")
    told: list[tuple[str, str]] = []
    controller = Controller(providers, store, poll_s=0.1, read_timeout_s=30.0,
                            notify=lambda event, text: told.append((event, text)))
    launch_again = relaunch.launch_again

    async def refused_once_on_both(*args, slices=None, **kw):
        if slices == (0, 1) and not any("injected" in text for _, text in told):
            raise UserError("injected: a host of slice 0 did not answer")
        return await launch_again(*args, slices=slices, **kw)

    try:
        await provider.create(CreateRequest(name="ms", accelerator_type="local-1x1", slices=2))
        first = await launch(providers, "ms", job=spec)
        managed = hand_over(store, first, job, [], Budgets(confirm_s=0.3))
        fail_on_two.touch()
        await provider.preempt("ms", slice_index=0)

        # shrunk, slice 0 made again, grown: the run on both fails at its start; back on slice 1, where
        # it stays for the back-off
        run = await drive(controller, lambda r: len(r.incarnations) == 4 and r.current.first_step_at,
                          managed.id, store)
        shrunk, grown, back = run.incarnations[1:]
        assert shrunk.slices == [1] and grown.slices is None and back.slices == [1]
        assert grown.run_id and grown.ended == "grow failed: the run on 2 slices failed before its first step"
        assert run.status == "RUNNING" and len(run.recoveries) == 1  # a failed grow is no recovery
        assert "growing back to 2 slices failed 1 of 3 time(s)" in run.note
        assert env_of(1, back.run_id)["TPU_CONSOLE_NUM_SLICES"] == "1"
        assert [event for event, _ in told] == ["preempted", "recovered", "grown", "grow-failed"]
        for _ in range(5):
            await controller.run_pass()
            await controller.wait_idle()
        assert len(st.load(store, managed.id).run.incarnations) == 4  # held back

        # once due, the next grow's launch fails: back again; the third holds
        fail_on_two.unlink()
        monkeypatch.setattr(relaunch, "launch_again", refused_once_on_both)
        monkeypatch.setattr(elastic, "GROW_BACKOFF_S", 0.01)
        run = await drive(controller, lambda r: len(r.incarnations) == 7 and r.current.first_step_at,
                          managed.id, store)
        assert run.incarnations[4].ended == "grow failed: injected: a host of slice 0 did not answer"
        assert run.incarnations[5].slices == [1] and run.incarnations[5].ended.startswith("every slice READY")
        assert [event for event, _ in told][4:] == ["grown", "grow-failed", "grown"]
        assert "failed 2 of 3 time(s), last: injected" in told[5][1]
        assert run.current.slices is None
        assert [env_of(w, run.current.run_id)["TPU_CONSOLE_NUM_SLICES"] for w in range(2)] == ["2", "2"]
        assert run.status == "RUNNING" and run.note is None and len(run.recoveries) == 1
    finally:
        await controller.stop()
        stop_groups([g for w in range(2) for g in running_job_groups(worker_home(w, "ms"))], grace_s=1.0)
        await provider.close()
