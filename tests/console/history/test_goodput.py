"""Goodput from synthetic timelines: each badput category on its own, and the parts always add up."""

from __future__ import annotations

import pytest

from tpu_console.history.goodput import (
    IDLE,
    LOST,
    OTHER,
    PRODUCTIVE,
    PROVISIONING,
    SETUP,
    STARTUP,
    Span,
    StepMark,
    Timeline,
    goodput,
    summary_fields,
)


def steps(first: int, count: int, start: float, every: float, first_s: float | None = None) -> list[StepMark]:
    """`count` steps numbered from `first`, the first done `first_s` after `start` (else `every`)."""
    t = start + (first_s if first_s is not None else every)
    marks = []
    for i in range(count):
        marks.append(StepMark(first + i, t))
        t += every
    return marks


def adds_up(result) -> None:
    assert sum(result.seconds.values()) == pytest.approx(result.total_s)


def test_steady_steps_after_a_slow_first_step_are_productive_and_the_excess_is_startup():
    # launched at 0, first step done at 60 (compile), then one every 2 s until step 10 at 78; ended at 80
    result = goodput(Timeline(launched_at=0, steps=steps(1, 10, 0, 2.0, first_s=60), ended_at=80))
    adds_up(result)
    assert result.total_s == 80
    assert result.typical_step_s == pytest.approx(2.0)
    assert result.seconds[STARTUP] == pytest.approx(58.0)  # the first step's 60 s less one typical 2 s
    assert result.seconds[PRODUCTIVE] == pytest.approx(20.0)  # ten steps of 2 s
    assert result.seconds[OTHER] == pytest.approx(2.0)  # after the last step until the end
    assert result.percent() == pytest.approx(25.0)
    assert result.steps == 10 and result.restarts == 0


def test_provisioning_setup_and_the_idle_gaps_before_the_launch():
    prep = [Span("create", 0, 300), Span("bootstrap", 400, 500), Span("sync", 500, 520),
            Span("setup", 530, 600)]
    result = goodput(Timeline(launched_at=700, steps=steps(1, 5, 700, 10.0), prep=prep, ended_at=750))
    adds_up(result)
    assert result.total_s == 750
    assert result.seconds[PROVISIONING] == 300
    assert result.seconds[SETUP] == 100 + 20 + 70
    assert result.seconds[IDLE] == 100 + 10 + 100  # after create, between sync and setup, before launch
    assert result.seconds[PRODUCTIVE] == pytest.approx(50.0)


def test_overlapping_and_late_preparation_is_counted_once_and_not_after_the_launch():
    prep = [Span("bootstrap", 0, 100), Span("sync", 50, 120), Span("sync", 900, 950)]
    result = goodput(Timeline(launched_at=120, steps=steps(1, 3, 120, 10.0), ended_at=150))
    assert result.total_s == 30  # no preparation given: the run starts at the launch
    result = goodput(Timeline(launched_at=120, steps=steps(1, 3, 120, 10.0), prep=prep, ended_at=150))
    adds_up(result)
    assert result.seconds[SETUP] == 120 and result.seconds[IDLE] == 0 and result.total_s == 150


def test_a_restart_loses_the_steps_done_again_and_the_time_to_the_restart():
    # attempt 1: steps 1..10 every 5 s from launch (done at 5..50), checkpoint after step 6; the job fails
    # and the supervisor restarts it at 70. Attempt 2 resumes after step 6: steps 7..12, the first after 25 s.
    first = steps(1, 10, 0, 5.0)
    second = steps(7, 6, 70, 5.0, first_s=25)
    result = goodput(Timeline(launched_at=0, steps=first + second, restarts=[70], ended_at=120))
    adds_up(result)
    assert result.restarts == 1
    assert result.typical_step_s == pytest.approx(5.0)
    # lost: steps 7..10 of the first attempt (done 30..50, 4 x 5 s) and 50 -> 70 waiting for the restart
    assert result.seconds[LOST] == pytest.approx(20.0 + 20.0)
    assert result.seconds[STARTUP] == pytest.approx(20.0)  # the second attempt's first step: 25 - 5
    # kept: steps 1..6 of the first attempt and 7..12 of the second
    assert result.seconds[PRODUCTIVE] == pytest.approx(30.0 + 30.0)
    assert result.steps == 12
    assert result.seconds[OTHER] == pytest.approx(120 - 120)


def test_a_restart_without_a_checkpoint_loses_every_step_before_it():
    first = steps(1, 4, 0, 5.0)
    second = steps(1, 4, 30, 5.0)
    result = goodput(Timeline(launched_at=0, steps=first + second, restarts=[30], ended_at=50))
    adds_up(result)
    assert result.seconds[LOST] == pytest.approx(20.0 + 10.0)
    assert result.seconds[PRODUCTIVE] == pytest.approx(20.0)


def test_an_attempt_that_made_no_step_is_startup():
    result = goodput(Timeline(launched_at=0, steps=steps(1, 3, 40, 2.0), restarts=[40], ended_at=46))
    adds_up(result)
    assert result.seconds[STARTUP] == pytest.approx(40.0)
    assert result.seconds[PRODUCTIVE] == pytest.approx(6.0)


def test_a_live_run_counts_one_step_under_way_and_the_rest_of_the_wait_as_other():
    result = goodput(Timeline(launched_at=0, steps=steps(1, 5, 0, 2.0), now=30))
    adds_up(result)
    assert result.live
    assert result.seconds[PRODUCTIVE] == pytest.approx(10.0 + 2.0)
    assert result.seconds[OTHER] == pytest.approx(18.0)


def test_one_step_uses_the_programs_own_step_time_as_the_typical_step():
    result = goodput(Timeline(launched_at=0, steps=[StepMark(1, 30, step_s=4.0)], ended_at=31))
    assert result.typical_step_s == 4.0
    assert result.seconds[STARTUP] == pytest.approx(26.0)
    assert result.seconds[PRODUCTIVE] == pytest.approx(4.0)


def test_no_steps_at_all_is_all_startup_and_no_time_has_no_goodput():
    result = goodput(Timeline(launched_at=0, ended_at=20))
    assert result.seconds[STARTUP] == 20 and result.percent() == 0.0
    assert goodput(Timeline(launched_at=5, ended_at=5)).percent() is None
    assert summary_fields(None)["goodput_pct"] is None


def test_the_json_and_the_line():
    result = goodput(Timeline(launched_at=0, steps=steps(1, 10, 0, 2.0, first_s=60), ended_at=80))
    document = result.to_json()
    assert document["goodput_pct"] == 25.0
    assert document["badput_pct"]["startup"] == 72.5
    assert set(document["badput_s"]) == {
        "provisioning", "setup", "startup", "lost_to_restarts", "lost_to_preemptions", "idle", "other"}
    assert result.line() == "goodput 25.0% of 1m20s · program start-up 72.5% · other 2.5%"
    assert summary_fields(result)["badput_startup_pct"] == 72.5


def test_compare_shows_goodput_rows_only_where_a_run_has_goodput():
    from tpu_console.history.summary import compare_table

    result = goodput(Timeline(launched_at=0, steps=steps(1, 10, 0, 2.0, first_s=60), ended_at=80))
    _, cells = compare_table(["a", "b"], [summary_fields(result), summary_fields(None)])
    rows = {cell[0]: cell[1:] for cell in cells}
    assert rows["goodput: productive steps (%)"] == ("25", "-", "-")
    assert rows["badput: program start-up (%)"][0] == "72.5"
    _, cells = compare_table(["a", "b"], [{}, {}])
    assert not any("goodput" in cell[0] or "badput" in cell[0] for cell in cells)


def test_the_preparation_log_keeps_failed_setups_but_not_failed_creates(tmp_path):
    import asyncio

    from tpu_console.history.prep_log import PrepLog, timed

    log = PrepLog(tmp_path / "console.sqlite")
    log.add("pod", "create", 10, 20, ok=False)  # no node came of it
    log.add("pod", "create", 30, 40, ok=True)
    log.add("pod", "bootstrap", 50, 60, ok=False)
    log.add("other", "sync", 55, 56, ok=True)
    assert [(s.kind, s.start) for s in log.spans("pod")] == [("create", 30), ("bootstrap", 50)]
    assert [s.kind for s in log.spans("pod", since=45, until=100)] == ["bootstrap"]
    with pytest.raises(ValueError):
        log.add("pod", "launch", 1, 2, ok=True)

    async def failing() -> int:
        raise RuntimeError("unreachable")

    with pytest.raises(RuntimeError):
        asyncio.run(timed("pod", "sync", failing()))
    assert asyncio.run(timed("pod", "setup", asyncio.sleep(0, result=1), ok=lambda status: status == 0)) == 1
    kinds = [s.kind for s in PrepLog().spans("pod")]  # timed keeps to the console's own store
    assert kinds == ["sync", "setup"]


def test_what_a_preemption_cost_a_managed_run_is_its_own_bucket():
    """Steps 1-10 every 2 s from t=10, preempted after step 10 (t=28); the relaunch at t=60 resumed after
    step 8 (steps 9-10 done again) and made steps 9-12 from t=70: the steps done again and the time to the
    relaunch are lost to the preemption, not to a restart."""
    marks = [*steps(1, 10, 8, 2.0), *steps(9, 4, 68, 2.0)]
    result = goodput(Timeline(launched_at=0, steps=marks, restarts=[60.0], recovered=[60.0], ended_at=76))
    assert result.seconds["lost_to_restarts"] == 0
    assert result.seconds["lost_to_preemptions"] == 4.0 + 32.0  # steps 9-10, then 28 s to 60 s
    assert result.steps == 12 and result.restarts == 1
    plain = goodput(Timeline(launched_at=0, steps=marks, restarts=[60.0], ended_at=76))
    assert plain.seconds["lost_to_restarts"] == result.seconds["lost_to_preemptions"]
