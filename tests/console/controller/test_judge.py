"""The controller's judgement over made-up readings: a node is lost only when two reads some seconds apart
say so; a failed or slow read says nothing either way; jobs killed on a node still READY are a preemption
not reported yet, for a few looks; a host unreachable past lost_after_s is lost; and a node is touched only
when it is this run's, of its incarnation or older."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from tpu_console.controller.judge import KILLED_READS, judge, not_ours
from tpu_console.controller.observe import SHUTDOWN_NOTICE_S, NodeReading, RunReading, preemption_deadline
from tpu_console.controller.state import INCARNATION_LABEL, MANAGED_LABEL, Incarnation, ManagedRun, Recovery
from tpu_console.domain import AcceleratorShape, Node, NodeState
from tpu_console.observe.supervision import Decision

MADE = datetime(2026, 1, 1, tzinfo=UTC)


def node(state: NodeState = NodeState.READY, labels: dict | None = None, made: datetime = MADE) -> Node:
    return Node("spot", "gcp", AcceleratorShape("v6e-8", 1, 8, 8), state, labels=labels or {},
                created_at=made)


def managed(**kw) -> ManagedRun:
    run = ManagedRun(id="m1", provider="gcp", node="spot", accelerator_type="v6e-8", job={}, confirm_s=5,
                     lost_after_s=60, incarnations=[Incarnation(0, "spot", created_at=MADE.timestamp(),
                                                                run_id="r0")])
    for key, value in kw.items():
        setattr(run, key, value)
    return run


def seen(at: float, state: NodeState | None = NodeState.READY, error: str | None = None) -> NodeReading:
    if error:
        return NodeReading(at, error=error)
    return NodeReading(at, absent=True) if state is None else NodeReading(at, node=node(state))


RUNNING = RunReading(0, state="running", last_step=3)


def test_a_lost_node_is_confirmed_only_by_two_reads_some_seconds_apart():
    run = managed()
    assert judge(run, seen(100, NodeState.PREEMPTED), None).action == "wait"
    assert judge(run, seen(102, NodeState.PREEMPTED), None).action == "wait"  # too soon after the first
    verdict = judge(run, seen(105, NodeState.PREEMPTED), None)
    assert verdict.action == "recover" and verdict.reason == "preempted"
    run = managed()
    assert judge(run, seen(100, None), None).action == "wait"
    assert judge(run, seen(106, None), None).reason == "vanished"
    run = managed()
    judge(run, seen(100, NodeState.TERMINATED), None)
    assert judge(run, seen(106, NodeState.TERMINATED), None).reason == "terminated"


def test_a_failed_or_slow_read_neither_confirms_nor_clears_and_a_usable_read_clears():
    run = managed()
    judge(run, seen(100, NodeState.PREEMPTED), None)
    for at in (103, 110, 200):  # failing and timing-out reads: nothing is decided on them
        assert judge(run, seen(at, error="503 Service Unavailable"), None).action == "wait"
    assert run.suspect["first_at"] == 100
    assert judge(run, seen(201, NodeState.READY), RUNNING).action == "wait" and run.suspect is None
    assert judge(run, seen(202, NodeState.PREEMPTED), None).action == "wait"  # a new suspicion starts
    run = managed()
    judge(run, seen(100, NodeState.PREEMPTED), None)
    assert judge(run, seen(106, None), None).action == "wait"  # preempted then absent: two different words


def test_a_run_that_ends_on_a_ready_node_ends_the_managed_run():
    for state, status in (("succeeded", "SUCCEEDED"), ("failed", "FAILED"), ("stopped", "STOPPED")):
        verdict = judge(managed(), seen(1), RunReading(1, state=state))
        assert verdict.action == "end" and verdict.status == status
    assert judge(managed(), seen(1), RunReading(1, state="failed", stop_requested=True)).status == "STOPPED"


def test_a_run_ended_after_a_preemption_notice_did_not_finish_whatever_its_exit_status():
    run = managed()
    for state in ("succeeded", "failed"):  # exited 0 on the notice's SIGTERM, or 143
        noticed = RunReading(100, state=state, preempted_by=130)
        assert judge(run, seen(100), noticed).action == "wait"  # the VM is going: wait for the node
        assert judge(run, seen(189), replace(noticed, at=189)).action == "wait"
        verdict = judge(run, seen(191), replace(noticed, at=191))  # still READY well past the deadline
        assert verdict.action == "recover" and verdict.in_place and verdict.reason.startswith("preempted")
    stopped = RunReading(100, state="succeeded", preempted_by=130, stop_requested=True)
    assert judge(run, seen(100), stopped).status == "STOPPED"


def test_the_supervisors_decisions_say_when_the_vm_was_to_stop():
    notice = Decision(10.0, "preemption-notice", "worker 0: preempted", {"notice": {"deadline": 40.0}})
    shutdown = Decision(12.0, "ended", "the run preempted", {"outcome": "preempted"})
    assert preemption_deadline([Decision(5.0, "started", "")]) is None
    assert preemption_deadline([notice, shutdown]) == 40.0
    assert preemption_deadline([shutdown]) == 12.0 + SHUTDOWN_NOTICE_S
    assert preemption_deadline([Decision(12.0, "ended", "", {"outcome": "succeeded"})]) is None


def test_jobs_killed_unasked_on_a_ready_node_are_looked_at_a_few_times_before_the_end_is_final():
    run = managed()
    killed = RunReading(1, state="failed", killed_unasked=True)
    for _ in range(KILLED_READS):
        assert judge(run, seen(1), killed).action == "wait"
    assert judge(run, seen(1), killed).status == "FAILED"
    run = managed()
    judge(run, seen(1), killed)  # then the provider reports it: a preemption, recovered
    judge(run, seen(2, NodeState.PREEMPTED), None)
    assert judge(run, seen(8, NodeState.PREEMPTED), None).action == "recover"


def test_a_host_unreachable_past_lost_after_s_is_lost():
    run = managed()
    lost = RunReading(10, state="running", lost_workers=True)
    assert judge(run, seen(10), lost).action == "wait"
    assert judge(run, seen(40), replace(lost, at=40)).action == "wait"
    assert judge(run, seen(45), replace(RUNNING, at=45)).action == "wait" and run.lost_since is None
    judge(run, seen(50), replace(lost, at=50))
    verdict = judge(run, seen(111), replace(lost, at=111))
    assert verdict.action == "recover" and verdict.reason == "host lost"
    assert judge(managed(), seen(1), RunReading(1, error="timeout")).action == "wait"


def test_a_node_is_touched_only_when_it_is_this_runs_of_its_incarnation_or_older():
    run = managed()
    assert not_ours(run, node(), 0) is None  # the first incarnation, made by hand: by its creation time
    assert "made by someone else" in not_ours(run, node(made=MADE.replace(hour=3)), 0)
    mine = {MANAGED_LABEL: "m1", INCARNATION_LABEL: "2"}
    assert not_ours(run, node(labels=mine), 2) is None and not_ours(run, node(labels=mine), 5) is None
    assert "newer than 1" in not_ours(run, node(labels=mine), 1)
    assert "belongs to managed run m2" in not_ours(run, node(labels={MANAGED_LABEL: "m2"}), 9)


def test_an_elastic_run_shrinks_onto_the_slices_left_and_grows_back_once_all_are_ready():
    reads = iter(range(100, 1000, 5))  # a read every 5 s (confirm_s)

    def two(*states: NodeState) -> NodeReading:
        worst = next((s for s in states if s != NodeState.READY), NodeState.READY)
        made = replace(node(worst), slices=2, slice_states=tuple(map(str, states)))
        return NodeReading(next(reads), node=made)

    R, P = NodeState.READY, NodeState.PREEMPTED
    run = managed(slices=2, job={"kind": "trainer"})
    assert judge(run, two(R, P), None).action == "wait"  # one read: not yet
    verdict = judge(run, two(R, P), None)
    assert (verdict.action, verdict.slices, verdict.reason) == ("shrink", (0,), "slice 1 preempted")
    run.incarnations.append(Incarnation(1, "spot", slices=[0], run_id="r1"))
    # on slice 0 alone: its run is read and judged there; the lost slice is no loss of the node's
    assert judge(run, two(R, P), RUNNING).action == "wait" and run.suspect is None
    assert judge(run, two(R, R), RUNNING).action == "wait"  # whole again, but no step made on slice 0 yet
    run.current.first_step_at = 1.0
    verdict = judge(run, two(R, R), RUNNING)
    assert (verdict.action, verdict.slices) == ("grow", (0, 1))
    rigid = managed(slices=2, job={"kind": "command", "spec": {}})  # not elastic: the whole node recovered
    judge(rigid, two(R, P), None)
    assert judge(rigid, two(R, P), None).action == "recover"


def test_budgets_stop_recoveries():
    run = managed(max_recoveries=1, recoveries=[Recovery(1, "preempted", 0.0)])
    assert "1 recoveries already made" in run.budget_left(10)
    run = managed(max_cost=10.0, price_per_hour=20.0)
    assert run.budget_left(MADE.timestamp() + 1200) is None
    assert "cost $20.00" in run.budget_left(MADE.timestamp() + 3600)
    run = managed(deadline=100.0)
    assert run.budget_left(99) is None and "deadline" in run.budget_left(101)


def test_a_managed_runs_goodput_counts_what_its_preemptions_cost_in_their_own_bucket():
    from tpu_console.controller.state import timeline
    from tpu_console.history.goodput import goodput

    # incarnation 0: steps 1-10 from t=10 to t=28, preempted; incarnation 1 relaunched at t=60, resumed
    # after step 8, steps 9-20 from t=70 to t=92, succeeded at t=93
    run = managed(status="SUCCEEDED", incarnations=[
        Incarnation(0, "spot", started_at=0.0, first_step_at=10.0, resumed_step=0, last_step=10,
                    last_step_at=28.0, ended_at=30.0, ended="preempted"),
        Incarnation(1, "spot", started_at=60.0, first_step_at=70.0, resumed_step=8, last_step=20,
                    last_step_at=92.0, ended_at=93.0, ended="succeeded")])
    result = goodput(timeline(run, now=100.0))
    assert result.seconds["lost_to_preemptions"] == pytest.approx(4.0 + 32.0)  # steps 9-10, 28 s to 60 s
    assert result.seconds["lost_to_restarts"] == 0 and result.steps == 20 and result.total_s == 93.0
