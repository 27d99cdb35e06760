"""A command job's TensorBoard event files and W&B summary, read from a local pod's workers
(observe/foreign_metrics.py): real event files written with tensorboard's own writer and read back with
tbparse; copied again only when they grew; the summary filled where the events say nothing; and of two
runs in the same project folder, each reads only the files it wrote."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tpu_console.history.events import Event, StepMetrics
from tpu_console.observe import foreign_metrics as fm
from trainer import telemetry as tm

event_pb2 = pytest.importorskip("tensorboard.compat.proto.event_pb2")
summary_pb2 = pytest.importorskip("tensorboard.compat.proto.summary_pb2")
writer_module = pytest.importorskip("tensorboard.summary.writer.event_file_writer")

JOB_DIR = "tpu-console/projects/abc123"


def write_scalars(folder: Path, steps: range, tags: dict[str, float]) -> None:
    writer = writer_module.EventFileWriter(str(folder))
    for step in steps:
        values = [summary_pb2.Summary.Value(tag=t, simple_value=v * step) for t, v in tags.items()]
        writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                         summary=summary_pb2.Summary(value=values)))
    writer.close()


def record_of(metrics: dict, run_id: str = "20260101-000000-abcd") -> SimpleNamespace:
    job = {"kind": "command", "command": ["python", "-m", "tunix_train"], "cwd": JOB_DIR, "metrics": metrics}
    return SimpleNamespace(run_id=run_id, workers=[0, 1], job=job)


def launched(local_pod, run_id: str, at: float | None = None, workers=(0, 1)) -> None:
    """What launch leaves before the job starts: the run folder with its launch.json (written `at`)."""
    for worker in workers:
        manifest = local_pod.worker_dir(worker) / "tpu-console" / "runs" / run_id / "launch.json"
        manifest.parent.mkdir(parents=True)
        manifest.write_text("{}")
        os.utime(manifest, (at, at) if at is not None else (time.time() - 60,) * 2)


def written_at(at: float, *paths: Path) -> None:
    for path in paths:
        for file in [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]:
            os.utime(file, (at, at))


async def test_tensorboard_and_wandb_of_a_command_job(local_pod, local_fleet):
    record = record_of({"format": "auto", "tensorboard": "logs/tb", "wandb": None})
    launched(local_pod, record.run_id)
    job_dir = local_pod.worker_dir(0) / JOB_DIR
    write_scalars(job_dir / "logs" / "tb" / "train", range(1, 6), {"loss": 0.5, "perf/step_time": 2.0})
    summary = job_dir / "wandb" / "run-20260101_000001-abcd" / "files" / "wandb-summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({tm.STEP_AVG_LAST10: 10.02, tm.VALID_TOKENS_PER_S: 4144.0,
                                   tm.MEM_PEAK: 27.5, "_runtime": 812, "run_name": "x"}))

    readings = await fm.read_foreign(local_fleet, record)
    assert readings.tensorboard == {0: {"loss": (5, 2.5), "perf/step_time": (5, 10.0)}}
    assert readings.wandb == {
        0: {tm.STEP_AVG_LAST10: 10.02, tm.VALID_TOKENS_PER_S: 4144.0, tm.MEM_PEAK: 27.5}
    }
    assert readings.problems == ["worker 1 has no TensorBoard event files in tpu-console/projects/abc123/"
                                 "logs/tb yet"]  # no summary on worker 1 is no problem: wandb was not named
    lines = readings.lines()
    assert lines[0] == ("W&B worker 0: time/train/step_avg_last10_s 10.02, throughput/train/"
                        "valid_tokens_per_s 4144, memory/train/peak_bytes_in_use_max_gib 27.5")
    assert lines[1] == "TensorBoard worker 0 (step 5, 2 tags): loss 2.5, perf/step_time 10"

    # The summary of a run whose events said nothing of these: the W&B numbers under the same names.
    filled = fm.complete_summary({tm.STEP_AVG_LAST10: None, tm.MEM_PEAK: None, tm.REWARD_MEAN: 0.5}, readings)
    assert filled == {tm.STEP_AVG_LAST10: 10.02, tm.MEM_PEAK: 27.5, tm.REWARD_MEAN: 0.5,
                      tm.VALID_TOKENS_PER_S: 4144.0}

    # More steps: the grown file is copied again; an unchanged one is not.
    cached = sorted(fm.tensorboard_cache(record.run_id, 0).rglob("events.out.tfevents.*"))
    assert len(cached) == 1
    first_copy = cached[0].stat().st_mtime_ns
    write_scalars(job_dir / "logs" / "tb" / "eval", range(1, 3), {"eval/accuracy": 0.25})
    readings = await fm.read_foreign(local_fleet, record, [0])
    assert readings.tensorboard[0]["eval/accuracy"] == (2, 0.5)
    assert cached[0].stat().st_mtime_ns == first_copy


async def test_the_trainer_has_nothing_foreign_and_a_named_wandb_folder_is_missed(local_fleet):
    trainer = SimpleNamespace(run_id="r", workers=[0], job=None)
    assert await fm.read_foreign(local_fleet, trainer) == fm.ForeignReadings()
    readings = await fm.read_foreign(local_fleet, record_of({"wandb": "runs/wandb"}), [0])
    assert readings.problems == [
        f"W&B summary of worker 0: no {JOB_DIR}/runs/wandb/*/files/wandb-summary.json written by this run yet"
    ]


async def test_two_runs_in_one_project_folder_each_read_only_what_they_wrote(local_pod, local_fleet):
    metrics = {"format": "auto", "tensorboard": "logs/tb", "wandb": "wandb"}
    first, second = record_of(metrics, "20260101-000000-aaaa"), record_of(metrics, "20260101-001000-bbbb")
    job_dir = local_pod.worker_dir(0) / JOB_DIR
    wandb = job_dir / "wandb"
    now = time.time()

    # The first run: launched, wrote its event file and its W&B run folder (latest-run pointing at it), ended.
    launched(local_pod, first.run_id, now - 100, workers=[0])
    write_scalars(job_dir / "logs" / "tb" / "train", range(1, 4), {"loss": 1.0})
    summary = wandb / "run-20260101_000001-aaaa" / "files" / "wandb-summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text(json.dumps({tm.STEP_AVG_LAST10: 1.0}))
    (wandb / "latest-run").symlink_to("run-20260101_000001-aaaa")
    written_at(now - 90, job_dir / "logs", summary)
    exit_file = local_pod.worker_dir(0) / "tpu-console" / "runs" / first.run_id / "exit"
    exit_file.write_text("0\n")
    written_at(now - 80, exit_file)

    # The second run, launched in the same project folder, has written nothing yet (still compiling):
    # neither the first run's event file nor its summary behind latest-run are taken for its own.
    launched(local_pod, second.run_id, now - 70, workers=[0])
    readings = await fm.read_foreign(local_fleet, second, [0])
    assert readings.wandb == {} and readings.tensorboard == {}
    assert readings.problems == [
        f"W&B summary of worker 0: no {JOB_DIR}/wandb/*/files/wandb-summary.json written by this run yet",
        f"worker 0 has no TensorBoard event files in {JOB_DIR}/logs/tb yet",
    ]

    # Its own files: a second event file beside the first one's, a run folder of its own.
    time.sleep(0.01)  # a distinct file name from tensorboard's writer (its time is in the name)
    write_scalars(job_dir / "logs" / "tb" / "train", range(1, 3), {"loss": 2.0})
    own = wandb / "run-20260101_001001-bbbb" / "files" / "wandb-summary.json"
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({tm.STEP_AVG_LAST10: 2.0}))
    assert len(list((job_dir / "logs" / "tb" / "train").iterdir())) == 2
    readings = await fm.read_foreign(local_fleet, second, [0])
    assert readings.tensorboard == {0: {"loss": (2, 4.0)}} and readings.problems == []
    assert readings.wandb == {0: {tm.STEP_AVG_LAST10: 2.0}}  # latest-run still names the first run

    # And the first run, looked at again, still reads only its own (nothing after its exit).
    readings = await fm.read_foreign(local_fleet, first, [0])
    assert readings.tensorboard == {0: {"loss": (3, 3.0)}}
    assert readings.wandb == {0: {tm.STEP_AVG_LAST10: 1.0}}


def step(fmt: str | None) -> StepMetrics:
    return StepMetrics.from_event(Event("step", 1.0, 0, {"step": 3, "format": fmt}))


def test_steps_note_says_where_the_steps_come_from_or_that_none_matched():
    assert fm.steps_note(SimpleNamespace(job=None), {0: step(None)}) is None  # the trainer
    assert fm.steps_note(record_of({"format": "auto"}), {0: step("maxtext"), 1: None}) == (
        "steps: from output.log (maxtext format)")
    assert fm.steps_note(record_of({"format": "auto"}), {0: None}) == (
        "steps: no line of the output matched (auto: seeds, maxtext, jsonl, loop, tqdm, keras) yet: launch "
        "with --metrics FORMAT|REGEX, or set [metrics] format or regex in the job file, to the program's "
        "step line")
    ended = record_of({"format": "auto"})
    ended.finished = True  # after the end, no "yet": what was not recognised, and how to say it
    assert fm.steps_note(ended, {0: None}) == (
        "steps: no step line was recognised in the output (auto: seeds, maxtext, jsonl, loop, tqdm, keras); "
        "to read the program's, launch with --metrics 'REGEX' (a named group step, e.g. 'iter "
        "(?P<step>\\d+)') or set [metrics] regex in the job file")
    watched_to_the_end = fm.steps_note(record_of({"format": "auto"}), {0: None}, ended=True)  # the app's feed
    assert watched_to_the_end == fm.steps_note(ended, {0: None})
    assert "regex 'it (?P<step>\\\\d+)'" in fm.steps_note(
        record_of({"format": "regex", "regex": r"it (?P<step>\d+)"}), {})
    assert fm.steps_note(record_of({"format": "none"}), {}) == (
        "steps: not read from the output (metrics format none)")


def test_the_watch_never_calls_a_job_whose_steps_are_not_read_silent():
    from tpu_console.observe.watch import RunWatch

    def watch_of(job):
        return RunWatch(None, SimpleNamespace(run_id="r", workers=[0], stop_requested_at=None, job=job))

    assert watch_of({"kind": "command", "metrics": {"format": "none"}}).thresholds.silent_s == float("inf")
    assert watch_of({"kind": "command", "metrics": {"format": "auto"}}).thresholds.silent_s == 1800.0
    assert watch_of(None).thresholds.silent_s == 1800.0  # the trainer
