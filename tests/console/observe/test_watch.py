"""RunWatch against a real local pod, with faults injected: connections dropped mid-stream, a job killed, a
worker's SSH server stopped and started again, fail-fast. Jobs are bash scripts started by the real wrapper
(run_recipes.start_detached), so the files, pid and exit status are those of a real run."""

from __future__ import annotations

import asyncio
import base64
import os
import random
import signal
from datetime import UTC, datetime

import pytest

from tests.conftest import LocalPod
from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.results import WorkerLine, WorkerResult
from tpu_console.history.run_id import new_run_id
from tpu_console.history.store import RunRecord
from tpu_console.observe import watch as watch_module
from tpu_console.observe.health import Activity
from tpu_console.observe.watch import HealthChanged, LogLines, NewEvents, RunWatch, SignatureFound, WatchEnded
from tpu_console.secrets import SecretMasker


def record_for(run_id: str, workers: list[int]) -> RunRecord:
    return RunRecord(
        run_id=run_id,
        node="pod",
        provider="local",
        accelerator_type="local-4x2",
        workers=workers,
        config_path="cfg.yaml",
        config_digest="d",
        overrides=[],
        python="bash",
        started_at=datetime.now(UTC),
    )


async def start_job(fleet: Fleet, run_id: str, workers: list[int], script: str) -> None:
    for result in await fleet.run(run_recipes.prepare_run_dir(run_id), workers, timeout=30):
        assert result.ok, result.stderr
    for result in await fleet.run(
        run_recipes.start_detached(run_id, "bash", ["-c", script], {}), workers, timeout=30
    ):
        assert result.ok, result.stderr


def run_file(pod: LocalPod, worker: int, run_id: str, name: str):
    return pod.worker_dir(worker) / "tpu-console" / "runs" / run_id / name


# Writes N numbered lines fast (for a few seconds) (some long, some with a secret), an event every 500 lines,
# and a last line
# without a newline.
FAST_WRITER = """
for i in $(seq 1 {n}); do
  if [ $((i % 500)) = 0 ]; then
    echo '{{"t": 1, "kind": "step", "process": 0, "step": '$i', "time/train/step_s": 0.5}}' >> events.jsonl
    echo "line $i token=sekrit-value-123 $(printf 'x%.0s' $(seq 1 300))"
  else
    echo "line $i"
  fi
  if [ $((i % 100)) = 0 ]; then sleep 0.03; fi
done
printf 'last line without newline'
"""


async def test_no_line_lost_or_repeated_while_connections_drop_many_times(local_pod, local_fleet):
    run_id, workers, n = new_run_id(), [0, 1], 6000
    await start_job(local_fleet, run_id, workers, FAST_WRITER.format(n=n))
    watch = RunWatch(
        local_fleet,
        record_for(run_id, workers),
        masker=SecretMasker(["sekrit-value-123"]),
        poll_s=0.05,
        max_bytes=16 * 1024,
    )  # small chunks: many chances to cut one
    received: dict[int, list[str]] = {0: [], 1: []}
    events = {0: 0, 1: 0}
    drops = 0

    async def drop_connections() -> None:
        nonlocal drops
        rng = random.Random(7)
        while True:  # at random moments, so some drops land in the middle of a poll
            await asyncio.sleep(rng.uniform(0.03, 0.2))
            local_fleet.connection(rng.choice(workers)).drop()
            drops += 1

    dropper = asyncio.create_task(drop_connections())
    try:
        async for update in watch.updates():
            if isinstance(update, LogLines):
                received[update.worker].extend(update.lines)
            elif isinstance(update, NewEvents):
                events[update.worker] += len(update.events)
    finally:
        dropper.cancel()
    assert drops > 10 and sum(watch.workers[w].broken_follows for w in workers) > 0  # it did get cut
    for worker in workers:
        text = run_file(local_pod, worker, run_id, "output.log").read_text()
        expected = text.replace("sekrit-value-123", "***").split("\n")
        assert received[worker] == expected  # every line once, in order, masked, the unterminated one too
        assert events[worker] == n // 500
        assert watch.monitor.workers[worker].exit_status == 0
        assert len(watch.workers[worker].lines) == min(len(expected), 5000)  # the ring buffer is bounded


LONG_JOB = """
echo started
echo '{"t": 1, "kind": "start", "process": 0}' >> events.jsonl
i=0
while true; do
  i=$((i+1)); echo '{"t": 2, "kind": "step", "process": 0, "step": '$i', "time/train/step_s": 0.1}' >> events.jsonl
  echo "step $i"; sleep 0.1
done
"""  # noqa: E501 - an event line of the fake trainer


async def _until(watch: RunWatch, condition, timeout: float = 5.0) -> float:
    """Seconds until `condition(health)` held, polling the watch's health."""
    start = asyncio.get_running_loop().time()
    while not condition(watch.health()):
        if asyncio.get_running_loop().time() - start > timeout:
            raise AssertionError(f"not within {timeout}s: {watch.health().verdict}")
        await asyncio.sleep(0.05)
    return asyncio.get_running_loop().time() - start


async def test_a_killed_job_shows_exited_and_the_others_hung_until_they_are_stopped(
    local_pod, local_fleet
):
    run_id, workers = new_run_id(), [0, 1, 2]
    await start_job(local_fleet, run_id, workers, LONG_JOB)
    watch = RunWatch(local_fleet, record_for(run_id, workers), poll_s=0.1)
    task = asyncio.create_task(watch.run())
    await _until(watch, lambda h: all(w.activity is Activity.RUNNING for w in h.workers.values()))
    pgid = int(run_file(local_pod, 1, run_id, "pid").read_text())
    os.killpg(pgid, signal.SIGKILL)
    seconds = await _until(watch, lambda h: h.workers[1].activity is Activity.EXITED)
    assert seconds < 5
    await _until(watch, lambda h: h.hung == (0, 2))  # the watch says so; stopping them is not its part
    assert not task.done()
    for result in await local_fleet.run(run_recipes.stop_run(run_id, 2), [0, 2], timeout=30):  # `stop`'s way
        assert result.ok, result.stderr
    health = await asyncio.wait_for(task, 20)
    assert health.first_failure == 1 and health.failure.startswith("worker 1 exited 137")
    assert [health.workers[w].exit_status for w in workers] == [143, 137, 143]


async def test_a_job_gone_with_its_wrapper_is_lost_and_the_others_are_marked_hung(local_pod, local_fleet):
    run_id, workers = new_run_id(), [0, 1]
    await start_job(local_fleet, run_id, workers, LONG_JOB)
    watch = RunWatch(local_fleet, record_for(run_id, workers), poll_s=0.1)
    task = asyncio.create_task(watch.run())
    try:
        await _until(watch, lambda h: h.workers[1].activity is Activity.RUNNING)
        pgid = int(run_file(local_pod, 1, run_id, "pid").read_text())
        wrapper = [p for p in _pids_in_session(pgid) if p != pgid]
        for pid in wrapper:  # the wrapper first, so nobody writes the exit file
            os.kill(pid, signal.SIGKILL)
        os.killpg(pgid, signal.SIGKILL)
        assert await _until(watch, lambda h: h.workers[1].activity is Activity.LOST) < 5
        health = watch.health()
        assert health.hung == (0,) and "still running after that failure" in health.verdict
    finally:
        os.killpg(int(run_file(local_pod, 0, run_id, "pid").read_text()), signal.SIGKILL)
        await asyncio.wait_for(task, 20)


def _pids_in_session(pgid: int) -> list[int]:
    """The wrapper is the session leader of the job's group (setsid, then set -m)."""
    sid = os.getsid(pgid)
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and _sid(int(p)) == sid]


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


async def test_a_worker_whose_ssh_server_stops_is_unreachable_then_recovers_without_losing_lines(
    local_pod, local_fleet
):
    run_id, workers = new_run_id(), [0, 1]
    script = "for i in $(seq 1 60); do echo line $i; sleep 0.05; done"
    await start_job(local_fleet, run_id, workers, script)
    watch = RunWatch(local_fleet, record_for(run_id, workers), poll_s=0.1)
    received: list[str] = []
    activities: list[Activity] = []

    def on_update(update) -> None:
        if isinstance(update, LogLines) and update.worker == 1:
            received.extend(update.lines)
        if isinstance(update, HealthChanged):
            activities.append(update.health.workers[1].activity)

    task = asyncio.create_task(watch.run(on_update))
    await _until(watch, lambda h: len(received) > 3)
    server = local_pod.provider.worker_server("pod", 1)
    await server.close()
    await _until(watch, lambda h: h.workers[1].activity is Activity.UNREACHABLE)
    await asyncio.sleep(1.0)  # down for a while, as a rebooting worker is
    await server.start(server.port)
    await asyncio.wait_for(task, 30)
    assert Activity.UNREACHABLE in activities and activities[-1] is Activity.EXITED
    assert received == [f"line {i}" for i in range(1, 61)]


@pytest.mark.parametrize("channels", [True, False], ids=["agent-fork", "exec-path"])
async def test_signatures_and_events_arrive_as_updates_and_the_watch_ends(local_pod, channels):
    async with Fleet(local_pod.targets, command_channels=channels) as fleet:
        if channels:
            await fleet.start_command_channels()  # the follower runs in a fork of the agent
        await _signatures_and_events(fleet)


async def _signatures_and_events(local_fleet: Fleet) -> None:
    run_id, workers = new_run_id(), [0]
    script = (
        "echo 'wandb: View run at https://wandb.ai/e/p/runs/abc123'; "
        'echo \'{"t": 1, "kind": "error", "process": 0, "message": "boom"}\' >> events.jsonl; '
        "echo 'jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory in memory space "
        "hbm. Used 17.44G of 15.48G hbm.'; exit 1"
    )
    await start_job(local_fleet, run_id, workers, script)
    async with asyncio.timeout(20):
        updates = [u async for u in RunWatch(local_fleet, record_for(run_id, workers), poll_s=0.1).updates()]
    kinds = [u.finding.kind for u in updates if isinstance(u, SignatureFound)]
    assert kinds == ["wandb_url", "oom"]
    assert isinstance(updates[-1], WatchEnded)
    assert updates[-1].health.failure == "worker 0 exited 1: boom"


async def test_a_log_opened_at_its_last_lines_needs_only_the_followers(local_pod, local_fleet):
    run_id, workers = new_run_id(), [0, 1]
    await start_job(local_fleet, run_id, workers, "for i in 1 2 3 4 5; do echo line $i; done; printf 'end'")
    sent = []  # what the watch asks of the workers: only their followers (no tail command first)
    follow, run = local_fleet.follow, local_fleet.run

    async def counted_follow(command, worker, on_line):
        sent.append(("follow", worker))
        return await follow(command, worker, on_line)

    async def counted_run(command, workers=None, **options):
        sent.append(("run", command))
        return await run(command, workers, **options)

    local_fleet.follow, local_fleet.run = counted_follow, counted_run
    watch = RunWatch(local_fleet, record_for(run_id, workers), poll_s=0.1, first_log_lines=2)
    async with asyncio.timeout(20):
        await watch.run()
    assert [list(watch.workers[w].lines) for w in workers] == [["line 5", "end"]] * 2
    assert sorted(sent) == [("follow", 0), ("follow", 1)]


class _BrokenFleet:
    """asyncssh can raise odd errors when a connection dies while a channel opens (seen under load)."""

    async def follow(self, *args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'session_started'")


async def test_a_follow_that_raises_is_a_broken_follow_and_a_watch_that_raises_reaches_its_consumer():
    watch = RunWatch(_BrokenFleet(), record_for(new_run_id(), [0]))
    follow = await watch._follow_once(watch.workers[0], streamed=True)
    assert not follow.ended and follow.problem.startswith("follow failed: AttributeError")

    async def broken_run(on_update=None):
        raise RuntimeError("the watch broke")

    watch.run = broken_run
    with pytest.raises(RuntimeError, match="the watch broke"):
        async with asyncio.timeout(5):  # never a hang waiting for a WatchEnded that cannot come
            async for _ in watch.updates():
                pass


async def test_a_consumer_that_falls_behind_slows_the_followers_and_loses_nothing(local_pod, local_fleet):
    run_id, workers = new_run_id(), [0, 1]
    await start_job(local_fleet, run_id, workers, "seq 1 3000 | sed 's/^/line /'")  # all at once
    watch = RunWatch(local_fleet, record_for(run_id, workers), poll_s=0.05, max_bytes=512)  # many updates
    received: dict[int, list[str]] = {0: [], 1: []}
    most_queued = 0
    async with asyncio.timeout(60):
        async for update in watch.updates(max_queued=5):
            most_queued = max(most_queued, watch._queue.qsize())
            if isinstance(update, LogLines):
                received[update.worker].extend(update.lines)
                await asyncio.sleep(0.01)  # a slow screen
    for worker in workers:
        assert received[worker] == [f"line {i}" for i in range(1, 3001)]
    assert sum(watch.workers[w].broken_follows for w in workers) == 0  # held back, not broken
    assert sum(watch.workers[w].held_back for w in workers) > 0 and most_queued > 5  # it did fall behind
    assert most_queued < 200  # bounded: what was in flight when the followers were held, no more


class _BurstFleet:
    """Every worker's follower sends a burst of log records at once (as when a step reaches every worker of
    a large pod in one round), stays a moment, then says its job has ended."""

    async def follow(self, command, worker: int, on_line):
        offset = 0
        for i in range(5):
            data = f"line {i}\n".encode()
            encoded = base64.b64encode(data).decode()
            on_line(WorkerLine(worker, "stdout", f"C output.log {offset} {offset + len(data)} 0 {encoded}"))
            offset += len(data)
        await asyncio.sleep(0.05)  # still streaming while every other worker's burst waits for the consumer
        on_line(WorkerLine(worker, "stdout", f"P pid=1 alive=0 exit=0 exit_t=1.0 log={offset} events=0"))
        on_line(WorkerLine(worker, "stdout", "E"))
        return WorkerResult(worker, 0, "", "", 0.0, None)


async def test_a_burst_from_every_worker_of_a_large_pod_holds_no_follower():
    workers = list(range(300))  # 1,500 updates at once: more than MAX_QUEUED, within QUEUED_PER_WORKER each
    watch = RunWatch(_BurstFleet(), record_for(new_run_id(), workers))
    received: dict[int, list[str]] = {w: [] for w in workers}
    async with asyncio.timeout(60):
        async for update in watch.updates():
            if isinstance(update, LogLines):
                received[update.worker].extend(update.lines)
    assert all(lines == [f"line {i}" for i in range(5)] for lines in received.values())
    assert sum(watch.workers[w].held_back for w in workers) == 0  # not stopped and started again


class _SilentFleet:
    """A follower whose connection went half-dead: no record, no error, ever."""

    def __init__(self) -> None:
        self.cancelled = 0

    async def follow(self, *args, **kwargs):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


async def test_a_silent_follower_is_stopped_and_the_worker_shows_unreachable(monkeypatch):
    monkeypatch.setattr(watch_module, "SILENCE_S", 0.3)
    fleet = _SilentFleet()
    watch = RunWatch(fleet, record_for(new_run_id(), [0]))
    follow = await asyncio.wait_for(watch._follow_once(watch.workers[0], streamed=True), 5)
    assert follow.problem == "no answer within 0.3s" and fleet.cancelled == 1


async def test_a_worker_without_python3_says_so(local_pod, monkeypatch):
    run_id = new_run_id()
    real = run_recipes.follow_run
    monkeypatch.setattr(run_recipes, "follow_run", lambda *a, **k: real(*a, **k, python="no-such-python3"))
    async with Fleet(local_pod.targets, command_channels=False) as fleet:  # where no agent can run
        await start_job(fleet, run_id, [0], "sleep 5")
        watch = RunWatch(fleet, record_for(run_id, [0]))
        follow = await asyncio.wait_for(watch._follow_once(watch.workers[0], streamed=True), 10)
    assert "no-such-python3" in follow.problem and follow.problem.endswith(
        "(following a run needs python3 on the worker's PATH)"
    )
    assert "\n" not in follow.problem


def test_the_health_is_judged_less_often_where_a_judgement_takes_long():
    assert watch_module.next_judgement_in(0.001, every_s=0.25) == 0.25  # a small pod: every 0.25 s
    # a judgement taking 50 ms of CPU (thousands of workers) waits 20 times that: 5% of a core at most
    waited = watch_module.next_judgement_in(0.05, every_s=0.25)
    assert waited == pytest.approx(0.05 / watch_module.HEALTH_SHARE) and waited > 0.25


def test_a_chunk_is_masked_as_its_lines_are_one_by_one():
    masker = SecretMasker(["sekrit-value-123", "two\nline-secret"])
    lines = ["a sekrit-value-123 b", "", "x two", "line-secret y sekrit-value-123"]
    assert watch_module._masked(masker, lines) == [masker.mask(line) for line in lines] == [
        "a *** b", "", "x two", "line-secret y ***"]  # a secret across two lines is in neither of them
