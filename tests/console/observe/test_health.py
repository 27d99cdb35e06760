"""Run health (activities, stalls, hung workers, stragglers), the run summary, the comparison table and the
history's summary columns. Pure logic, with the clock passed in."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

from tpu_console.history.events import Event, StepMetrics
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.history.summary import compare_rows, compare_table, summarize
from tpu_console.observe.health import Activity, Progress, Thresholds, assess
from tpu_console.observe.monitor import RunMonitor
from tpu_console.observe.probe import RunProbe
from trainer import telemetry as tm

RUN = "20250101-000000-abcd"
T = Thresholds(stall_factor=3.0, stall_floor_s=10.0, straggler_factor=1.5)


def step_event(step: int, step_s: float = 1.0, **phases: float) -> Event:
    fields = {"step": step, tm.phase_key("step"): step_s, tm.STEP_AVG_LAST10: step_s}
    fields.update({tm.phase_key(name): seconds for name, seconds in phases.items()})
    return Event("step", 0.0, 0, fields)


def running(monitor: RunMonitor, worker: int, *events: Event) -> None:
    monitor.observe(worker, RunProbe(RUN, pgid=10 + worker, alive=True, events=list(events)))


def test_activities_from_starting_to_exited():
    monitor, progress = RunMonitor(RUN, [0, 1, 2, 3]), {}
    running(monitor, 1)
    running(monitor, 2, Event("start", 0.0, 2))
    running(monitor, 3, Event("start", 0.0, 3), step_event(4))
    health = assess(monitor, progress, now=100.0, thresholds=T)
    assert [health.workers[w].activity for w in range(4)] == [
        Activity.STARTING, Activity.STARTING, Activity.COMPILING, Activity.RUNNING]
    assert health.workers[3].label == "running at step 4"
    monitor.observe(3, RunProbe(RUN, pgid=13, exit_status=0, exit_time=5.0))
    monitor.observe_unreachable(2, "connection refused")
    health = assess(monitor, progress, now=103.0, thresholds=T)
    assert health.workers[3].label == "exited(0)" and health.workers[3].for_s == 0.0
    assert (
        health.workers[2].activity is Activity.UNREACHABLE
        and health.workers[2].reason == "connection refused"
    )
    assert health.workers[1].for_s == 3.0  # starting since the first look


def test_stall_of_one_worker_while_others_progress_then_all_silent():
    monitor, progress = RunMonitor(RUN, [0, 1]), {}
    for w in (0, 1):
        running(monitor, w, step_event(1, step_s=5.0))
    assess(monitor, progress, now=0.0, thresholds=T)
    # worker 0 keeps stepping; worker 1 stays at step 1
    for now, step in ((5.0, 2), (10.0, 3), (15.0, 4)):
        running(monitor, 0, step_event(step, step_s=5.0))
        health = assess(monitor, progress, now=now, thresholds=T)
    assert health.stalled == () and health.workers[1].activity is Activity.RUNNING  # 15 s: 3 x 5 s, not more
    health = assess(monitor, progress, now=16.0, thresholds=T)
    assert health.stalled == (1,) and not health.all_silent
    assert health.workers[1].label == "stalled at step 1" and health.workers[1].step_age_s == 16.0
    assert "worker(s) 1 stalled while others progress" in health.verdict
    health = assess(monitor, progress, now=31.0, thresholds=T)  # worker 0 silent for 16 s too now
    assert health.stalled == (0, 1) and health.all_silent and "looks hung" in health.verdict
    running(monitor, 1, step_event(2, step_s=5.0))  # it moves again
    health = assess(monitor, progress, now=32.0, thresholds=T)
    assert health.workers[1].activity is Activity.RUNNING and health.stalled == (0,)


def test_a_failure_marks_the_workers_still_running_as_hung():
    monitor, progress = RunMonitor(RUN, [0, 1, 2]), {}
    for w in (0, 1, 2):
        running(monitor, w, step_event(3))
    monitor.observe(
        1,
        RunProbe(
            RUN, pgid=11, exit_status=1, exit_time=7.0, events=[Event("error", 7.0, 1, {"message": "boom"})]
        ),
    )
    health = assess(monitor, progress, now=10.0, thresholds=T)
    assert health.hung == (0, 2) and health.first_failure == 1
    assert health.workers[0].hung and health.workers[0].label == "running at step 3, hung"
    assert health.verdict.endswith(
        "first failure: worker 1 exited 1: boom; worker(s) 0,2 still running after "
        "that failure (likely hung in a collective): stop them"
    )


def test_stragglers_by_step_time_or_by_one_phase():
    monitor, progress = RunMonitor(RUN, [0, 1, 2, 3]), {}
    running(monitor, 0, step_event(5, step_s=1.0, rollout_generate=0.6, update=0.3))
    running(monitor, 1, step_event(5, step_s=1.05, rollout_generate=0.6, update=0.35))
    running(monitor, 2, step_event(5, step_s=1.0, rollout_generate=0.6, update=0.9))  # slow update phase
    running(monitor, 3, step_event(5, step_s=2.2, rollout_generate=0.6, update=0.3))  # slow step
    health = assess(monitor, progress, now=1.0, thresholds=T)
    assert health.stragglers == (2, 3)
    assert health.workers[3].straggler == "step 2.20s vs median 1.00s (2.2x)"
    assert health.workers[2].straggler == "update 0.90s vs median 0.30s (3.0x)"
    assert health.workers[0].straggler is None


def test_progress_only_counts_new_step_numbers():
    progress = Progress()
    progress.saw_step(3, 1.0)
    progress.saw_step(3, 9.0)
    assert progress.last_step_seen_at == 1.0


def metrics(
    step: int, step_avg: float, tokens: float, in_use: float | None, peak: float | None, reward: float
) -> StepMetrics:
    return StepMetrics(step, step_avg, step_avg, tokens, in_use, peak, None, 0.0, reward, {})


def test_summary_takes_the_worst_worker_and_keeps_unknowns_none():
    summary = summarize(
        {0: metrics(12, 12.7, 1510.4, 7.2, 8.0, 0.5), 1: metrics(12, 12.8, 1510.4, 7.3, 8.1, 0.5), 2: None}
    )
    assert summary[tm.STEP] == 12 and summary[tm.STEP_AVG_LAST10] == 12.8 and summary[tm.MEM_PEAK] == 8.1
    assert summary[tm.VALID_TOKENS_PER_S] == 1510.4 and summary[tm.MEM_LIMIT] is None
    cpu = summarize({0: metrics(1, 1.0, 100.0, None, None, 0.1)})
    assert cpu[tm.MEM_IN_USE] is None and cpu[tm.MEM_PEAK] is None


def test_compare_table_is_the_legacy_vs_maxtext_benchmark_summary():
    legacy = {
        tm.STEP_AVG_LAST10: 12.777984279200007,
        tm.VALID_TOKENS_PER_S: 1510.4229563367162,
        tm.MEM_IN_USE: 7.2652506828308105,
        tm.MEM_PEAK: 8.067610263824463,
        tm.REWARD_MEAN: None,
    }
    maxtext = {
        tm.STEP_AVG_LAST10: 13.443090026600043,
        tm.VALID_TOKENS_PER_S: 1361.5764398761153,
        tm.MEM_IN_USE: 7.265962600708008,
        tm.MEM_PEAK: 8.060301780700684,
        tm.REWARD_MEAN: None,
    }
    headers, rows = compare_table(["legacy-run", "maxtext-run"], [legacy, maxtext])
    assert headers == ("METRIC", "A legacy-run", "B maxtext-run", "B VS A")
    assert rows[0] == ("step time, avg of last 10 (s)", "12.78", "13.44", "+5.2%")  # the benchmark's ~+5.2%
    assert rows[1] == ("valid tokens/s", "1,510", "1,362", "-9.9%")
    assert rows[2][3] == "+0.0%" and rows[3][3] == "-0.1%"
    assert len(rows) == 4  # the reward neither run has is no row of dashes
    (step_row, *_) = compare_rows(["a", "b"], [legacy, None])
    assert step_row["values"] == {"a": legacy[tm.STEP_AVG_LAST10], "b": None} and step_row["change_pct"] == {
        "b": None
    }


def test_history_keeps_the_summary_and_archive_and_upgrades_an_old_database(tmp_path):
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # a database from before the summary columns
        db.execute(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, node TEXT NOT NULL, provider TEXT NOT NULL,"
            " accelerator_type TEXT NOT NULL, workers TEXT NOT NULL, config_path TEXT NOT NULL,"
            " config_digest TEXT NOT NULL, overrides TEXT NOT NULL, code_version TEXT, python TEXT NOT NULL,"
            " started_at TEXT NOT NULL, state TEXT NOT NULL, failure TEXT, finished_at TEXT,"
            " stop_requested_at TEXT)"
        )
    store = RunStore(path)
    store.add(
        RunRecord(RUN, "pod", "local", "local-2x2", [0, 1], "c.yaml", "d", [], "python3", datetime.now(UTC))
    )
    assert store.get(RUN).summary is None and store.get(RUN).archive_path is None
    store.set_summary(RUN, {tm.STEP_AVG_LAST10: 1.5, tm.MEM_IN_USE: None}, "/tmp/archive/x")
    store.set_summary(RUN, None, None)  # leaves both as they are
    record = RunStore(path).get(RUN)
    assert record.summary == {tm.STEP_AVG_LAST10: 1.5, tm.MEM_IN_USE: None}
    assert record.archive_path == "/tmp/archive/x"
