"""The controller's invariants against the TPU API emulator (the run side faked: fake_runs.py): a preempted
node is deleted only after two reads some seconds apart and made again (the next zone when its own has no
capacity); a failing or slow read deletes nothing; a node of a newer incarnation or of someone else is left
alone; a queued request filled after a give-up or a cancel is deleted; a controller killed between any two
of its actions and started again finishes the recovery without a duplicate; of two controllers at once
exactly one acts; and never two live nodes or queued requests of the run at any moment."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from tests.console.controller.fake_runs import FakeRuns
from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home, make_provider  # noqa: F401 - fixtures
from tpu_console.controller import state as st
from tpu_console.controller.judge import NOTICE_GRACE_S
from tpu_console.controller.loop import Controller
from tpu_console.controller.state import INCARNATION_LABEL, MANAGED_LABEL, Incarnation, ManagedRun
from tpu_console.controller.store import FolderStore

Z1, Z2, Z3 = ZONES
NAME = "spotty"


class Killed(BaseException):
    """A SIGKILL at this point: nothing after it runs in that controller."""


class Watch:
    """Counts the run's live nodes and queued requests in the emulator every few milliseconds."""

    def __init__(self, api, name: str = NAME) -> None:
        self.api, self.name, self.most, self._stop = api, name, 0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def live(self) -> int:
        with self.api._lock:
            nodes = [n for n in self.api._nodes.values() if n.node_id == self.name
                     and n.body.get("state") not in ("PREEMPTED", "TERMINATED", "DELETING")]
            waiting = [q for q in self.api._queued.values() if q.qr_id == self.name
                       and q.body.get("state", {}).get("state") not in ("FAILED", "DELETING", "ACTIVE")]
            return len(nodes) + len(waiting)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, self.live())
            time.sleep(0.005)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


@pytest.fixture
def world(emulator, make_provider, monkeypatch, tmp_path):
    provider = make_provider()
    runs = FakeRuns(provider)
    runs.install(monkeypatch)
    store = FolderStore(tmp_path / "controller")

    def controller(**kw) -> Controller:
        options = dict(poll_s=0.02, read_timeout_s=2.0, lease_ttl_s=1.5, sweep_s=1.5)
        return Controller({"gcp": provider}, store, **{**options, **kw})

    watch = Watch(emulator)
    yield provider, runs, store, controller
    assert watch.stop() <= 1, "two live nodes or queued requests of the run at once"


async def managed(provider, store, confirm_s: float = 0.3, **kw) -> ManagedRun:
    node = await provider.get(NAME)
    run = ManagedRun(id=st.new_id(), provider="gcp", node=NAME, accelerator_type="v6e-8", job={"kind": "x"},
                     zones=list(ZONES), confirm_s=confirm_s,
                     incarnations=[Incarnation(0, NAME, node.zone, created_at=node.created_at.timestamp(),
                                               run_id="run-first", last_step=10)], **kw)
    st.add(store, run)
    return run


async def drive(controller: Controller, until: Callable[[ManagedRun], bool], run_id: str, store,
                timeout: float = 60.0) -> ManagedRun:
    """Pass after pass, as `serve` takes them (the lease renewed while a step is under way), until
    `until(run)`; the run as it stands once the steps under way have finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await controller.run_pass()
        run = st.load(store, run_id).run
        if until(run):
            await controller.wait_idle()
            return st.load(store, run_id).run
        await asyncio.sleep(controller.poll_s)
    raise AssertionError(f"not reached in {timeout} s: {st.load(store, run_id).run}")


def recovered(run: ManagedRun) -> bool:
    return (run.status == "RUNNING" and len(run.incarnations) == 2
            and (run.intent or {}).get("action") == "watch")


def nodes(api, name: str = NAME) -> list[dict]:
    with api._lock:
        return [dict(n.body, zone=n.zone) for n in api._nodes.values() if n.node_id == name]


async def test_a_preempted_node_is_deleted_after_two_reads_and_made_again_in_the_next_zone(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store)
    emulator.preempt(Z1, NAME)
    emulator.stockout(Z1)
    told: list[tuple[str, str]] = []  # what the [notify] webhook is sent
    one = controller(notify=lambda event, text: told.append((event, text)))
    done = await drive(one, lambda r: recovered(r) and r.recoveries[0].first_step_at is not None, run.id,
                       store)
    (recovery,) = done.recoveries
    assert recovery.reason == "preempted" and recovery.confirmed_at - recovery.detected_at >= run.confirm_s
    assert recovery.deleted_at >= recovery.confirmed_at and recovery.zone == Z2
    assert done.incarnations[0].ended == "preempted" and done.incarnations[1].zone == Z2
    (node,) = nodes(emulator)
    assert node["zone"] == Z2 and node["state"] == "READY"
    assert node["labels"][MANAGED_LABEL] == run.id and node["labels"][INCARNATION_LABEL] == "1"
    assert runs.launched == [("run-0", "1")] and runs.prepared == ["1"]
    assert recovery.resumed_step == 8 and recovery.steps_lost == 2  # from the fake run's marks
    assert [event for event, _ in told] == ["preempted", "recovered"]
    assert "resumed after step 8, 2 step(s) lost" in told[1][1] and Z2 in told[1][1]


async def test_a_failing_or_slow_read_deletes_nothing(world, emulator, monkeypatch):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store)
    emulator.preempt(Z1, NAME)
    one = controller(read_timeout_s=0.3)
    emulator.fail_next("get", "UNAVAILABLE", "backend unavailable", times=10_000)
    with pytest.raises(AssertionError, match="not reached"):
        await drive(one, lambda r: r.status != "RUNNING", run.id, store, timeout=1.5)
    emulator._injected.clear()
    real_get = provider.get

    async def slow_get(name: str):
        await asyncio.sleep(1.0)  # past the read timeout: no answer
        return await real_get(name)

    monkeypatch.setattr(provider, "get", slow_get)
    with pytest.raises(AssertionError, match="not reached"):
        await drive(one, lambda r: r.status != "RUNNING", run.id, store, timeout=1.5)
    assert not any(verb == "DELETE" for verb, _ in emulator.requests)
    assert [n["state"] for n in nodes(emulator)] == ["PREEMPTED"] and runs.launched == []
    monkeypatch.setattr(provider, "get", real_get)
    await drive(one, recovered, run.id, store)


async def test_a_run_that_exited_0_after_a_preemption_notice_is_recovered_not_finished(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store)
    one = controller()
    # it caught the notice's SIGTERM and exited 0; the VM is to stop in 30 s: wait for the node to go
    runs.state, runs.preempted_by = "succeeded", time.time() + 30
    with pytest.raises(AssertionError, match="not reached"):
        await drive(one, lambda r: r.status != "RUNNING" or len(r.incarnations) > 1, run.id, store,
                    timeout=1.0)
    # the node stayed READY long past the notice's deadline: the run is relaunched on it, nothing deleted
    runs.preempted_by = time.time() - NOTICE_GRACE_S - 1
    done = await drive(one, recovered, run.id, store)
    assert done.recoveries[0].reason.startswith("preempted (notice")
    assert done.incarnations[0].ended.startswith("preempted") and runs.launched == [("run-0", "0")]
    assert not any(verb == "DELETE" for verb, _ in emulator.requests) and len(nodes(emulator)) == 1


async def test_a_new_node_the_doctor_finds_unfit_is_made_again(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store)
    emulator.preempt(Z1, NAME)
    finding = "worker 0 saw 3 of 4 chips: recreate the node"
    runs.findings = [finding]
    done = await drive(controller(), lambda r: len(r.incarnations) == 3 and (r.intent or {}).get("action")
                       == "watch", run.id, store)
    assert [r.reason for r in done.recoveries] == ["preempted", f"the pod doctor: {finding}"]
    assert done.incarnations[1].ended == f"the pod doctor: {finding}"
    assert runs.checked == ["1", "2"] and runs.launched == [("run-0", "2")] and len(nodes(emulator)) == 1


async def test_with_no_recovery_left_the_doctors_finding_gives_the_run_up(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store, max_recoveries=1)
    emulator.preempt(Z1, NAME)
    runs.findings = ["worker 0 did not answer"]
    done = await drive(controller(), lambda r: r.status == "GAVE_UP" and not r.intent, run.id, store)
    assert f"the pod doctor on {NAME}: worker 0 did not answer; 1 recoveries already made" in done.note
    assert nodes(emulator) == [] and runs.launched == []  # the unfit node it made goes


async def test_a_node_of_a_newer_incarnation_is_left_alone(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store)
    emulator._nodes.clear()  # the record is stale: a newer controller made incarnation 3, now preempted
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8", labels={MANAGED_LABEL: run.id, INCARNATION_LABEL: "3"})
    emulator.preempt(Z1, NAME)
    done = await drive(controller(), lambda r: r.status == "GAVE_UP" and not r.intent, run.id, store)
    assert "incarnation 3, newer than 1" in done.note
    assert [n["state"] for n in nodes(emulator)] == ["PREEMPTED"] and runs.launched == []


async def test_another_owners_node_of_the_same_name_is_left_alone(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store)
    emulator._nodes.clear()  # ours vanished ...
    one = controller()
    await drive(one, lambda r: r.suspect is not None, run.id, store)
    await asyncio.sleep(1.1)  # ... and someone else made one of the same name meanwhile (a later createTime)
    emulator.add_node(PROJECT, Z3, NAME, "v6e-8")
    done = await drive(one, lambda r: r.status == "GAVE_UP" and not r.intent, run.id, store)
    assert "made by someone else" in done.note
    assert [n["state"] for n in nodes(emulator)] == ["READY"] and runs.launched == []


async def test_a_queued_request_filled_after_the_run_was_cancelled_is_deleted(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store, queued=True, valid_for_s=60)
    emulator.capacity_after(Z1, 1.0)
    emulator.capacity_after(Z2, 1.0)
    emulator.capacity_after(Z3, 1.0)
    emulator.preempt(Z1, NAME)
    one = controller()
    await drive(one, lambda r: (r.intent or {}).get("action") == "create", run.id, store)
    await one.run_pass()  # the create: its requests wait for capacity
    for _ in range(200):
        if emulator._queued:
            break
        await asyncio.sleep(0.01)
    stored = st.load(store, run.id)
    stored.run.stop_requested = True  # `controller cancel`, from another console
    st.save(store, stored)
    await one.wait_idle()
    done = await drive(one, lambda r: r.status == "STOPPED" and not r.intent, run.id, store)
    assert done.note == "cancelled"
    assert nodes(emulator) == [] and not emulator._queued and runs.launched == []


async def test_a_request_filled_after_a_give_up_is_deleted(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store, queued=True)
    # what a controller killed in the middle of its create leaves: the journal says create, and its request
    # waits in Z2; then the deadline passes
    emulator._nodes.clear()
    marks = {MANAGED_LABEL: run.id, INCARNATION_LABEL: "1"}
    emulator.add_queued(PROJECT, Z2, NAME, "v6e-8", labels=marks)
    stored = st.load(store, run.id)
    stored.run.intent = {"action": "create", "n": 1, "at": time.time(), "by": "killed"}
    stored.run.deadline = time.time() + 4.0
    st.save(store, stored)
    one = controller(sweep_s=30)
    waiting = await drive(one, lambda r: (r.note or "").startswith("waiting for the queued"), run.id, store)
    assert waiting.status == "RUNNING" and runs.launched == []
    await asyncio.sleep(max(0.0, stored.run.deadline - time.time()))
    done = await drive(one, lambda r: r.status == "GAVE_UP", run.id, store)
    assert "deadline" in done.note
    await drive(one, lambda r: not emulator._queued, run.id, store)  # the waiting request deleted
    emulator.add_node(PROJECT, Z2, NAME, "v6e-8", labels=marks)  # a fill that raced the deletion
    await drive(one, lambda r: nodes(emulator) == [], run.id, store)
    assert runs.launched == []


@pytest.mark.timeout(240)
async def test_a_controller_killed_between_any_two_actions_finishes_the_recovery_without_a_duplicate(
        world, emulator, monkeypatch):
    provider, runs, store, controller = world
    points: list[str] = []
    kill_at: list[int] = [-1]

    def point(name: str) -> None:
        points.append(name)
        if len(points) - 1 == kill_at[0]:
            raise Killed(name)

    def wrap_async(owner, attr: str) -> None:
        real = getattr(owner, attr)

        async def wrapped(*a, **k):
            point(f"before {attr}")
            result = await real(*a, **k)
            point(f"after {attr}")
            return result

        monkeypatch.setattr(owner, attr, wrapped)

    for attr in ("create", "delete", "delete_queued"):
        wrap_async(provider, attr)
    from tpu_console.controller import relaunch

    for attr in ("prepare", "launch_again"):
        wrap_async(relaunch, attr)
    real_save, journaled = st.save, set()

    def save(store_, stored):
        intent = stored.run.intent or {}
        entry = (intent.get("action"), intent.get("at"))
        if entry in journaled:  # a heartbeat or a note: no action of the journal
            return real_save(store_, stored)
        journaled.add(entry)
        point(f"before journal {entry[0]}")
        real_save(store_, stored)
        point(f"after journal {entry[0]}")

    monkeypatch.setattr(st, "save", save)
    trial, total = 0, None
    while total is None or trial < total:
        emulator._nodes.clear()
        emulator._queued.clear()
        emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
        runs.launched.clear()
        kill_at[0] = -1
        run = await managed(provider, store, confirm_s=0.05)
        made = len(emulator.nodes_made)
        emulator.preempt(Z1, NAME)
        points.clear()
        kill_at[0] = trial
        first = controller()
        await drive(first, lambda r, t=trial: recovered(r) or len(points) > t, run.id, store, timeout=40)
        if len(points) <= trial:
            total = len(points)  # no kill happened: every point has been tried
            break
        killed_at = points[trial]
        for task in first._tasks.values():  # SIGKILL: nothing more from it, its lease is not released
            task.cancel()
        kill_at[0] = -1
        done = await drive(controller(), recovered, run.id, store, timeout=40)
        (node,) = nodes(emulator)
        assert node["state"] == "READY" and node["labels"][INCARNATION_LABEL] == "1", killed_at
        assert len(emulator.nodes_made) - made == 1, f"a second node made after a kill {killed_at}"
        assert [i for _, i in runs.launched] == ["1"], f"launched twice after a kill {killed_at}"
        assert len(done.recoveries) == 1, killed_at
        trial += 1
    # before and after each journal write (delete, create, prepare, launch, watch) and each remote action
    assert trial >= 14, points


async def test_of_two_controllers_started_together_exactly_one_acts(world, emulator):
    provider, runs, store, controller = world
    emulator.add_node(PROJECT, Z1, NAME, "v6e-8")
    run = await managed(provider, store)
    emulator.preempt(Z1, NAME)
    one, two = controller(), controller()
    await asyncio.gather(drive(one, recovered, run.id, store), drive(two, recovered, run.id, store))
    assert bool(one.actions) != bool(two.actions), (one.actions, two.actions)
    assert runs.launched == [("run-0", "1")] and len(nodes(emulator)) == 1
