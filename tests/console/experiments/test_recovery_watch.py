"""The recovery watch's judgement, with the node and the run read from stand-ins: a run whose jobs were all
killed while the node still read READY is a preemption the provider has not reported yet (the local pod's
preemption, and a spot VM's shutdown, end the jobs before or as the state changes), not a failure to keep."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpu_console.experiments import recovery


def view(state: str, statuses: list[int | None], stop_requested: bool = False) -> SimpleNamespace:
    record = SimpleNamespace(stop_requested_at="now" if stop_requested else None)
    workers = [SimpleNamespace(state="exited", exit_status=s, events=SimpleNamespace(last_step=None))
               for s in statuses]
    return SimpleNamespace(record=record, state=state, workers=workers)


@pytest.fixture
def watch(monkeypatch, tmp_path):
    """Runs launch_with_recovery over scripted node states and run views; returns (log, launches)."""
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(tmp_path))
    launches: list[str] = []

    async def run(node_states: list[str | None], views: list[SimpleNamespace]):
        node_states, views = list(node_states), list(views)

        async def launch(*_a, **_k):
            launches.append(f"run{len(launches)}")
            return SimpleNamespace(ok=True, run_id=launches[-1])

        async def node_lost(*_a):
            return node_states.pop(0) if len(node_states) > 1 else node_states[0]

        async def run_status(*_a):
            return views.pop(0) if len(views) > 1 else views[0]

        async def nothing(*_a, **_k):
            return SimpleNamespace(name="spot")

        async def resumed(*_a):
            return 3

        provider, node = SimpleNamespace(name="local"), SimpleNamespace(name="spot")
        monkeypatch.setattr(recovery, "open_node", lambda *_a: _async((provider, node)))
        monkeypatch.setattr(recovery, "require_durable_checkpoints", lambda *_a: None)
        monkeypatch.setattr(recovery, "launch", launch)
        monkeypatch.setattr(recovery, "_node_lost", node_lost)
        monkeypatch.setattr(recovery.run_control, "run_status", run_status)
        for name in ("recreate_node", "bootstrap_node", "sync_node"):
            monkeypatch.setattr(recovery, name, nothing)
        monkeypatch.setattr(recovery, "_resumed_step", resumed)
        log = await recovery.launch_with_recovery({}, "spot", "config.yaml", watch_every_s=0)
        return log, launches

    return run


async def _async(value):
    return value


async def test_jobs_killed_just_before_the_node_reads_preempted_are_recovered(watch):
    # The node reads READY, the run then reads failed (both jobs killed), and only then PREEMPTED.
    log, launches = await watch([None, None, "the node is PREEMPTED", None],
                                [view("failed", [137, 137]), view("succeeded", [0, 0])])
    assert log.final_state == "succeeded" and launches == ["run0", "run1"]
    assert [r.reason for r in log.recoveries] == ["the node is PREEMPTED"]


async def test_jobs_killed_on_a_node_that_stays_ready_end_the_run_after_a_few_looks(watch):
    log, launches = await watch([None], [view("failed", [137, 143])])
    assert log.final_state == "failed" and launches == ["run0"] and not log.recoveries


async def test_a_worker_that_failed_on_its_own_is_final_at_once(watch):
    # fail-fast: worker 1 exited 1, worker 0 was stopped (143): a real failure, no preemption suspected
    assert not recovery._killed_unasked(view("failed", [143, 1]))
    assert not recovery._killed_unasked(view("stopped", [143, 143], stop_requested=True))
    assert recovery._killed_unasked(view("failed", [137, 137]))
    log, _ = await watch([None], [view("failed", [143, 1])])
    assert log.final_state == "failed" and not log.recoveries
