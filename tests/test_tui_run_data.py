"""The run dashboard's data without a screen: the judgements (stragglers, memory levels, stalls), the step
history, and RunFeed turning runs-layer views into messages (masking secrets on the way)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tests.fixtures_cli import NOW
from tests.fixtures_run_dashboard import step_metrics
from tpu_console.runs.control import RunView
from tpu_console.runs.events import Event, EventSummary, StepMetrics
from tpu_console.runs.monitor import WorkerState, WorkerStatus
from tpu_console.runs.store import RunRecord
from tpu_console.secrets import SecretMasker
from tpu_console.tui.messages import RunFeedProblem, RunLogLines, RunStepsArrived, RunUpdated
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.run_snapshot import (
    StepHistory,
    memory_level,
    slowness,
    stalled_for,
    stragglers,
)
from tpu_console.tui.widgets.log_pane import printable


def test_slowness_is_against_the_median_of_the_other_workers():
    ratios = slowness({0: 1.0, 1: 1.0, 2: 2.0, 3: 1.1})
    assert ratios[2] == pytest.approx(2.0 / 1.0) and ratios[3] == pytest.approx(1.1 / 1.0)
    assert ratios[0] == pytest.approx(1.0 / 1.1)
    assert stragglers({0: 1.0, 1: 1.0, 2: 2.0, 3: 1.1}) == {2: pytest.approx(2.0)}
    assert slowness({0: 5.0}) == {}  # one worker has nobody to be slower than


def test_memory_levels_follow_the_fraction_of_the_limit_and_null_is_unknown():
    assert [memory_level(u, 16.0) for u in (8.0, 12.0, 14.4, 16.0)] == ["ok", "warn", "bad", "bad"]
    assert memory_level(None, 16.0) == memory_level(3.0, None) == memory_level(None, None) == "unknown"


def test_a_stall_needs_several_step_times_and_at_least_the_floor():
    assert stalled_for(1000.0, 1030.0, 5.0) is None  # 30 s: under the 60 s floor
    assert stalled_for(1000.0, 1061.0, 5.0) == 61.0
    assert stalled_for(1000.0, 1100.0, 40.0) is None  # slow steps: 3 x 40 s is the limit
    assert stalled_for(1000.0, 1121.0, 40.0) == 121.0
    assert stalled_for(None, 1121.0, 40.0) is None


def test_step_history_keeps_new_steps_bounded_and_gives_median_series():
    history = StepHistory(max_steps=3)
    assert history.add(0, [step_metrics(0, s) for s in (1, 2)])
    assert not history.add(0, [step_metrics(0, 2)])  # seen already
    history.add(0, [step_metrics(0, s) for s in (3, 4)])
    assert sorted(history.by_worker[0]) == [2, 3, 4]
    history.add(1, [step_metrics(1, s, slow=3.0) for s in (3, 4)])
    steps, values = history.series(lambda m: m.phases["rollout_generate"])
    assert steps == [2, 3, 4]
    assert values[0] == pytest.approx(2.02)  # one worker at step 2
    assert values[1] == pytest.approx((2.03 + 6.03) / 2)  # the median of two is their mean
    assert history.series(lambda m: m.mem_in_use_gib, worker=1)[0] == [3, 4]
    assert history.latest(1).step == 4 and history.latest(7) is None


# -- RunFeed -------------------------------------------------------------------------------------------

SECRET = "hunter2-s3cr3t-value"


def record() -> RunRecord:
    return RunRecord("20250314-120000-abcd", "pod", "local", "local-2x1", [0, 1], "c.yaml", "d", [],
                     "python", NOW)


def status(worker: int, state: WorkerState, step: int | None, **kwargs) -> WorkerStatus:
    events = EventSummary()
    if step is not None:
        events.add([Event("step", 1.0, worker, {"step": step, "time/train/step_s": 2.0,
                                                  "time/train/step_avg_last10_s": 2.0})])
    return WorkerStatus(worker, state=state, events=events, **kwargs)


def feed_at(clock) -> RunFeed:
    feed = RunFeed({}, "20250314-120000-abcd", clock=clock)
    feed.masker = SecretMasker([SECRET])
    return feed


def test_feed_posts_each_new_step_once_and_marks_a_worker_that_stopped_stepping_as_stalled():
    now = [NOW]
    feed = feed_at(lambda: now[0])
    view = RunView(record(), "running", [status(0, WorkerState.RUNNING, 3), status(1, WorkerState.RUNNING, 3)])
    first = feed.messages_for(view)
    assert [(type(m), getattr(m, "worker", None)) for m in first] == [
        (RunStepsArrived, 0), (RunStepsArrived, 1), (RunUpdated, None), (RunFeedProblem, None)]
    assert isinstance(first[0].steps[0], StepMetrics) and first[0].steps[0].step == 3

    now[0] = NOW + timedelta(seconds=90)  # worker 0 moved on, worker 1 is still at step 3
    view = RunView(record(), "running", [status(0, WorkerState.RUNNING, 4), status(1, WorkerState.RUNNING, 3)])
    second = feed.messages_for(view)
    assert [getattr(m, "worker", None) for m in second if isinstance(m, RunStepsArrived)] == [0]
    snapshot = next(m.snapshot for m in second if isinstance(m, RunUpdated))
    assert [(w.worker, w.step, w.stalled_s) for w in snapshot.workers] == [(0, 4, None), (1, 3, 90.0)]
    assert snapshot.updated_at == now[0] and not snapshot.ended


def test_feed_names_the_first_failure_and_masks_secrets_in_every_line():
    feed = feed_at(lambda: NOW)
    failed = status(1, WorkerState.EXITED, 2, exit_status=3, exit_time=100.0, log_tail=[f"token {SECRET}"])
    later = status(0, WorkerState.EXITED, 2, exit_status=143, exit_time=200.0)
    view = RunView(record(), "failed", [later, failed], failure=f"worker 1 exited 3: bad key {SECRET}")
    (snapshot,) = [m.snapshot for m in feed.messages_for(view) if isinstance(m, RunUpdated)]
    assert snapshot.ended and snapshot.first_failure == 1
    assert snapshot.failure == "worker 1 exited 3: bad key ***"
    assert snapshot.workers[1].last_line == "token ***" and snapshot.workers[1].exit_status == 3

    posted = []
    feed.take_line(0, f"export KEY={SECRET}")
    feed.take_line(0, "wandb: View run at https://wandb.ai/lab/grpo/runs/abc123")
    feed.flush(posted.append)
    feed.flush(posted.append)  # nothing new: no empty message
    assert len(posted) == 1 and isinstance(posted[0], RunLogLines)
    assert posted[0].lines == [(0, "export KEY=***"), (0, "wandb: View run at https://wandb.ai/lab/grpo/runs/abc123")]
    assert feed.wandb_url == "https://wandb.ai/lab/grpo/runs/abc123"


def test_log_lines_are_made_printable_so_they_cannot_move_the_cursor():
    progress = "Generating: 0 [00:00]\r\x1b[31mGenerating: 2000\x1b[0m [00:01]\r"
    assert printable(progress) == "Generating: 2000 [00:01]"
    assert printable("a\tb\x07c\x1b]0;title\x07") == "a   bc"
    assert printable("plain é ✓") == "plain é ✓"
