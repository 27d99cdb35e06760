"""The run dashboard's data without a screen: the arithmetic for drawing (ratios, memory levels), the step
history, and RunFeed turning a RunWatch's updates into messages (the judgements are the watcher's)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.console.tui.fixtures_run_dashboard import OOM_LINE, failed_run, hung_run, step_event, step_metrics
from tests.fixtures_cli import NOW
from tpu_console.history.events import Event
from tpu_console.history.store import RunRecord, RunStore, WorkerRecord
from tpu_console.observe.health import assess
from tpu_console.observe.monitor import RunMonitor
from tpu_console.observe.signatures import SignatureScanner
from tpu_console.observe.watch import HealthChanged, LogLines, NewEvents, RunWatch, SignatureFound, WatchEnded
from tpu_console.tui import run_feed
from tpu_console.tui.messages import RunFeedProblem, RunLogLines, RunStepsArrived, RunUpdated
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.run_snapshot import StepHistory, memory_level, slowness
from tpu_console.tui.widgets.log_pane import printable


def test_slowness_is_against_the_median_of_the_other_workers():
    ratios = slowness({0: 1.0, 1: 1.0, 2: 2.0, 3: 1.1})
    assert ratios[2] == pytest.approx(2.0 / 1.0) and ratios[3] == pytest.approx(1.1 / 1.0)
    assert ratios[0] == pytest.approx(1.0 / 1.1)
    assert slowness({0: 5.0}) == {}  # one worker has nobody to be slower than


def test_memory_levels_follow_the_fraction_of_the_limit_and_null_is_unknown():
    assert [memory_level(u, 16.0) for u in (8.0, 12.0, 14.4, 16.0)] == ["ok", "warn", "bad", "bad"]
    assert memory_level(None, 16.0) == memory_level(3.0, None) == memory_level(None, None) == "unknown"


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


def record(workers: int = 2) -> RunRecord:
    return RunRecord(
        "20250314-120000-abcd",
        "pod",
        "local",
        "local-2x1",
        list(range(workers)),
        "c.yaml",
        "d",
        [],
        "python",
        NOW,
    )


def new_feed() -> RunFeed:
    feed = RunFeed({}, "20250314-120000-abcd", clock=lambda: NOW)
    feed.record = record()
    return feed


def test_feed_posts_every_step_event_from_the_first_and_batches_the_lines():
    feed, posted = new_feed(), []
    events = [Event("start", 1.0, 0, {})] + [step_event(0, s) for s in range(1, 6)]
    feed.take(NewEvents(0, events), posted.append)
    feed.take(NewEvents(1, [step_event(1, 1)]), posted.append)
    assert posted == []  # steps wait for the next flush: one message for every worker's
    feed.flush(posted.append)
    (steps,) = posted
    assert isinstance(steps, RunStepsArrived)
    assert {w: [m.step for m in s] for w, s in steps.by_worker.items()} == {0: [1, 2, 3, 4, 5], 1: [1]}

    posted.clear()
    feed.take(LogLines(0, ["a", "b"]), posted.append)
    feed.take(LogLines(1, ["c"]), posted.append)
    assert posted == []  # lines wait for the next flush: one message for many lines
    feed.flush(posted.append)
    feed.flush(posted.append)  # nothing new: no empty message
    assert len(posted) == 1 and posted[0].lines == [(0, "a"), (0, "b"), (1, "c")]

    monitor = RunMonitor(feed.record.run_id, feed.record.workers)
    monitor.workers[0].events.add(events)
    feed.take(HealthChanged(assess(monitor, {}, 0.0)), posted.append)
    snapshot = posted[-1].snapshot
    assert [(w.worker, w.activity, w.step, w.last_line) for w in snapshot.workers] == [
        (0, "starting", 5, "b"),
        (1, "starting", None, "c"),
    ]


async def test_a_line_after_a_quiet_spell_is_posted_at_once_and_a_stream_is_batched():
    feed, posted = new_feed(), []
    feed.flush_every_s, feed.snapshot_every_s = 0.6, 3600.0

    def lines_posted() -> list:
        return [m.lines for m in posted if isinstance(m, RunLogLines)]

    async def posted_within(seconds: float, count: int) -> bool:
        deadline = asyncio.get_running_loop().time() + seconds
        while len(lines_posted()) < count and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        return len(lines_posted()) >= count

    ticker = asyncio.create_task(feed._tick(None, posted.append))  # the watch is asked only to judge
    try:
        await asyncio.sleep(0.7)  # quiet for longer than flush_every_s
        feed.take(LogLines(0, ["first"]), posted.append)
        assert await posted_within(0.3, 1)  # at once, not at the next 0.6 s tick
        feed.take(LogLines(0, ["second"]), posted.append)
        feed.take(LogLines(1, ["third"]), posted.append)
        assert not await posted_within(0.3, 2)  # within flush_every_s of the last message: they wait ...
        assert await posted_within(1.0, 2)  # ... and go together
        assert lines_posted() == [[(0, "first")], [(0, "second"), (1, "third")]]
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker


def test_feed_keeps_the_most_telling_log_signature_and_the_first_wandb_url():
    feed, posted = new_feed(), []
    scanner = SignatureScanner()
    lines = [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "ValueError: first",
        "wandb: View run at https://wandb.ai/lab/grpo/runs/one",
        OOM_LINE,
        "Traceback (most recent call last):",
        '  File "x.py", line 2',
        "KeyError: later",
        "wandb: View run at https://wandb.ai/lab/grpo/runs/two",
    ]
    for line in lines:
        if (finding := scanner.scan(line)) is not None:
            feed.take(SignatureFound(1, finding), posted.append)
    # Every problem is announced (the screen shows each kind once); URLs are not problems.
    assert [(m.worker, m.kind) for m in posted] == [(1, "exception"), (1, "oom"), (1, "exception")]
    assert posted[1].message.startswith("out of HBM: Used 17.44G of 15.48G hbm; out of device memory: reduce")
    assert feed.wandb_url == "https://wandb.ai/lab/grpo/runs/one"
    # The OOM explains the failure better than the traceback lines around it.
    assert feed.seen[1].problem.kind == "oom"


def test_the_snapshot_carries_the_watchers_judgement_of_a_run_hung_after_a_failure():
    status, _, _ = hung_run()
    snapshot = [m.snapshot for m in status if isinstance(m, RunUpdated)][-1]
    assert snapshot.state == "partially-dead" and not snapshot.ended
    assert snapshot.hung == (0, 2, 3) and snapshot.first_failure == 1
    assert snapshot.failure == "worker 1 exited 1: RESOURCE_EXHAUSTED: out of memory in hbm"
    assert [(w.activity, w.hung, w.failed) for w in snapshot.workers] == [
        ("running", True, False),
        ("exited", False, True),
        ("running", True, False),
        ("running", True, False),
    ]
    assert snapshot.workers[1].problem_kind == "oom" and snapshot.workers[1].exit_status == 1

    status, _, _ = failed_run()
    snapshot = [m.snapshot for m in status if isinstance(m, RunUpdated)][-1]
    assert snapshot.ended and snapshot.state == "failed" and snapshot.hung == ()


class ScriptedWatch(RunWatch):
    """A RunWatch whose updates are given (and that may fail after them), for the feed's retry logic."""

    def __init__(self, updates: list, fails: bool) -> None:
        super().__init__(fleet=None, record=record())  # type: ignore[arg-type] - never polls
        self.scripted, self.fails = updates, fails

    async def updates(self, max_queued: int = 1000):
        for update in self.scripted:
            yield update
        if self.fails:
            raise RuntimeError("channel torn down")
        health = self.health()
        yield WatchEnded(health)


async def test_a_watch_that_fails_half_way_is_reopened_where_it_stopped(monkeypatch):
    monkeypatch.setattr(run_feed, "RETRY_FIRST_S", 0.01)
    watches = [
        ScriptedWatch([LogLines(0, ["a"])], fails=True),
        ScriptedWatch([LogLines(0, ["b"])], fails=False),
    ]
    watches[0].workers[0].log.offset = 2  # how far the first one had read
    asked: list[int | None] = []

    @contextlib.asynccontextmanager
    async def open_watch(first_log_lines):
        asked.append(first_log_lines)
        yield watches[len(asked) - 1]

    feed = RunFeed({}, "20250314-120000-abcd", clock=lambda: NOW, open_watch=open_watch)
    posted = []
    await asyncio.wait_for(feed.follow(posted.append), 10)
    assert asked == [200, None]  # the second watch does not start over from the last 200 lines
    assert watches[1].workers[0].log.offset == 2  # ... but from where the first one stopped
    problems = [m.problem for m in posted if isinstance(m, RunFeedProblem)]
    assert problems == [None, "watching 20250314-120000-abcd failed: channel torn down", None]
    assert [m.lines for m in posted if isinstance(m, RunLogLines)] == [[(0, "a")], [(0, "b")]]
    assert isinstance(posted[-1], RunUpdated)


def test_log_lines_are_made_printable_so_they_cannot_move_the_cursor():
    progress = "Generating: 0 [00:00]\r\x1b[31mGenerating: 2000\x1b[0m [00:01]\r"
    assert printable(progress) == "Generating: 2000 [00:01]"
    assert printable("a\tb\x07c\x1b]0;title\x07") == "a   bc"
    assert printable("plain é ✓") == "plain é ✓"


async def test_a_run_whose_node_is_gone_shows_what_the_history_knows_and_the_feed_stops():
    store = RunStore()
    store.add(record())
    store.update(
        record().run_id, "running", [WorkerRecord(0, "exited", 10, None, 0), WorkerRecord(1, "running", 11)]
    )
    feed = RunFeed({}, record().run_id, store, clock=lambda: NOW)
    posted = []
    await asyncio.wait_for(feed.follow(posted.append), 30)  # returns: nothing more can come
    problems = [m.problem for m in posted if isinstance(m, RunFeedProblem)]
    assert problems == ["cannot watch 20250314-120000-abcd: node 'pod' no longer exists"]
    (snapshot,) = [m.snapshot for m in posted if isinstance(m, RunUpdated)]
    assert snapshot.ended and snapshot.state == "failed" and snapshot.first_failure == 1
    assert [(w.worker, w.activity, w.exit_status) for w in snapshot.workers] == [
        (0, "exited", 0),
        (1, "lost", None),
    ]
    assert snapshot.workers[1].reason == "node 'pod' no longer exists"
    await asyncio.wait_for(feed.follow_devices(posted.append), 10)  # nothing to read: says why, and ends
    assert posted[-1].problem == "the run has ended: libtpu reports only while a job holds the TPU"
