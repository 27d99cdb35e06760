"""Pure logic of the runs layer: run ids, shell recipes (run for real in bash against a temp HOME), event
parsing, probe parsing, resumable tails, the monitor's state machine, the run history."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.processes import pid_alive, wait_for
from tpu_console.errors import NotFound, UserError
from tpu_console.fleet import run_recipes
from tpu_console.fleet.program import PythonProgram
from tpu_console.history.events import EventSummary, parse_event_line, parse_events
from tpu_console.history.run_id import check_run_id, is_run_id, new_run_id, started_at
from tpu_console.history.store import RunRecord, RunStore, WorkerRecord
from tpu_console.history.tail import LogChunk, TailCursor, parse_chunk
from tpu_console.observe.monitor import RunMonitor, RunState, WorkerState
from tpu_console.observe.probe import RunProbe, parse_probe

RUN = "20250314-120000-beef"
HOSTILE = "a'b\"c $(touch PWNED) `touch PWNED2`; rm -rf / & \\ \n*"


# -- run ids ---------------------------------------------------------------------------------------------


def test_run_id_format_and_time():
    moment = datetime(2025, 3, 14, 12, 0, 5, tzinfo=UTC)
    run_id = new_run_id(moment, "0a1b")
    assert run_id == "20250314-120005-0a1b"
    assert started_at(run_id) == moment
    assert is_run_id(new_run_id())
    assert len({new_run_id(moment) for _ in range(50)}) > 40


@pytest.mark.parametrize(
    "text", ["", "20250314-120005", "20250314-120005-0A1B", "20251399-120005-0a1b", "../../etc", RUN + "x"]
)
def test_bad_run_ids_are_refused(text):
    assert not is_run_id(text)
    with pytest.raises(UserError, match="not a run id"):
        check_run_id(text)


def test_new_run_id_refuses_a_bad_suffix():
    with pytest.raises(ValueError):
        new_run_id(suffix="xyz!")


def test_config_validation_does_not_import_jax():
    # The console validates trainer configs on a laptop that may have no JAX at all.
    config = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"
    code = (
        "import sys\n"
        "from tpu_console import cli\n"
        "from tpu_console.launch.job_kinds import validate_config\n"
        f"assert validate_config({str(config)!r}, ['steps=3']).data['steps'] == 3\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'optax', 'numpy'))\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


# -- recipes, run in bash --------------------------------------------------------------------------------


def bash(command: str | PythonProgram, home: Path, timeout: float = 20) -> subprocess.CompletedProcess:
    """A recipe run as a worker runs it: bash, or a Python program on the exec path (source on stdin)."""
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    if isinstance(command, PythonProgram):
        return subprocess.run(["bash", "-c", command.command_line()], cwd=home, env=env, input=command.source,
                              capture_output=True, timeout=timeout, check=False)
    return subprocess.run(["bash", "-c", command], cwd=home, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def write_fake(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def test_prepare_makes_a_private_folder_once(tmp_path):
    assert bash(run_recipes.prepare_run_dir(RUN), tmp_path).returncode == 0
    folder = tmp_path / run_recipes.run_dir(RUN)
    assert folder.is_dir() and (folder.stat().st_mode & 0o777) == 0o700
    again = bash(run_recipes.prepare_run_dir(RUN), tmp_path)
    assert again.returncode == 3 and "already exists" in again.stderr


def test_start_runs_detached_records_pgid_output_and_exit(tmp_path):
    fake = write_fake(tmp_path / "fake py", 'echo "args=$*"; echo "v=$HOSTILE_VAR"; echo oops >&2; exit 7\n')
    bash(run_recipes.prepare_run_dir(RUN), tmp_path)
    folder = tmp_path / run_recipes.run_dir(RUN)
    command = run_recipes.start_detached(RUN, str(fake), ["-m", "trainer", HOSTILE], {"HOSTILE_VAR": HOSTILE})
    started = bash(command, tmp_path)
    assert started.returncode == 0, started.stderr
    pgid = int(started.stdout.strip().removeprefix("pgid="))
    assert pgid == int((folder / "pid").read_text())
    wait_for(lambda: (folder / "exit").exists())
    assert (folder / "exit").read_text().strip() == "7"
    log = (folder / "output.log").read_text()
    assert f"args=-u -m trainer {HOSTILE}" in log  # arguments arrive verbatim, in order
    assert f"v={HOSTILE}" in log
    assert "oops" in log  # stderr goes to the same file
    assert not list(tmp_path.rglob("PWNED*"))
    # a second start of the same run is refused
    assert bash(command, tmp_path).returncode == 3


def test_python_in_home_is_expanded_and_other_paths_are_quoted():
    assert run_recipes.python_word("~/venv/bin/python") == "\"$HOME\"/venv/bin/python"
    assert run_recipes.python_word("/opt/my py") == "'/opt/my py'"
    with pytest.raises(ValueError):
        run_recipes.start_detached(RUN, "python3", [], {"BAD NAME": "x"})


def test_env_file_is_sourced_and_reaches_the_job_only_through_the_environment(tmp_path):
    fake = write_fake(tmp_path / "py", 'echo "token=$TOKEN"; ps -eo args >ps.txt\n')
    bash(run_recipes.prepare_run_dir(RUN), tmp_path)
    folder = tmp_path / run_recipes.run_dir(RUN)
    (folder / ".env").write_text("TOKEN=s3cr3t-value\n")
    command = run_recipes.start_detached(RUN, str(fake), [], {})
    assert "s3cr3t" not in command
    assert bash(command, tmp_path).returncode == 0
    wait_for(lambda: (folder / "exit").exists())
    assert "token=s3cr3t-value" in (folder / "output.log").read_text()
    assert "s3cr3t" not in (folder / "ps.txt").read_text()


def test_stop_terms_the_whole_group_then_kills_what_ignores_it(tmp_path):
    # The job ignores TERM and has a child that ignores it too: only KILL ends them, after the grace.
    fake = write_fake(
        tmp_path / "py", "trap '' TERM; (trap '' TERM; sleep 300) & echo $! > child; sleep 300\n"
    )
    bash(run_recipes.prepare_run_dir(RUN), tmp_path)
    folder = tmp_path / run_recipes.run_dir(RUN)
    bash(run_recipes.start_detached(RUN, str(fake), [], {}), tmp_path)
    wait_for(lambda: (folder / "child").exists())
    child = int((folder / "child").read_text())
    start = time.monotonic()
    stopped = bash(run_recipes.stop_run(RUN, grace_s=0.5), tmp_path)
    assert time.monotonic() - start < 8
    assert stopped.stdout.split() == ["state=stopped", "signal=KILL", "exit=137"]
    assert not pid_alive(child)
    # stopping again says it already exited; a run that does not exist is reported, not an error
    assert bash(run_recipes.stop_run(RUN), tmp_path).stdout.split() == ["state=exited", "exit=137"]
    assert bash(run_recipes.stop_run("20250314-120000-0000"), tmp_path).stdout.strip() == "state=missing"


def test_stop_with_term_records_128_plus_15(tmp_path):
    fake = write_fake(tmp_path / "py", "sleep 300\n")
    bash(run_recipes.prepare_run_dir(RUN), tmp_path)
    bash(run_recipes.start_detached(RUN, str(fake), [], {}), tmp_path)
    stopped = bash(run_recipes.stop_run(RUN, grace_s=5), tmp_path)
    assert stopped.stdout.split() == ["state=stopped", "signal=TERM", "exit=143"]


def test_probe_reports_running_then_exited_with_events_and_log(tmp_path):
    fake = write_fake(
        tmp_path / "py",
        'echo \'{"t": 1, "kind": "step", "process": 0, "step": 1, "time/train/step_s": 2.5}\' >> '
        "events.jsonl\n"
        "echo line-a; echo line-b; while [ ! -e go ]; do sleep 0.05; done; exit 1\n",
    )
    bash(run_recipes.prepare_run_dir(RUN), tmp_path)
    folder = tmp_path / run_recipes.run_dir(RUN)
    bash(run_recipes.start_detached(RUN, str(fake), [], {}), tmp_path)
    wait_for(lambda: (folder / "output.log").exists() and "line-b" in (folder / "output.log").read_text())
    other = "20250314-120000-0001"
    probe = run_recipes.probe_runs([RUN, other], events_tail_bytes=4096, log_tail_lines=1)
    out = bash(probe, tmp_path).stdout
    probes = parse_probe(out.decode(), 4096)
    assert probes[other].missing
    running = probes[RUN]
    assert running.alive and running.exit_status is None and running.pgid
    assert running.log_bytes == len("line-a\nline-b\n") and running.log_tail == ["line-b"]
    assert [e.kind for e in running.events] == ["step"]
    (folder / "go").touch()
    wait_for(lambda: (folder / "exit").exists())
    done = parse_probe(bash(run_recipes.probe_runs([RUN]), tmp_path).stdout.decode())[RUN]
    assert not done.alive and done.exit_status == 1 and done.exit_time and done.events == []


def test_tail_reads_exact_bytes_from_an_offset_and_the_last_lines(tmp_path):
    folder = tmp_path / run_recipes.run_dir(RUN)
    folder.mkdir(parents=True)
    data = "héllo\nwörld\n".encode() + bytes([0xFF, 0x0A]) + b"partial"
    (folder / "output.log").write_bytes(data)
    chunk = parse_chunk(bash(run_recipes.tail_log(RUN, offset=3, max_bytes=5), tmp_path).stdout)
    assert chunk == LogChunk(end=8, size=len(data), data=data[3:8])
    last = parse_chunk(bash(run_recipes.tail_log(RUN, lines=2), tmp_path).stdout)
    assert last.end == len(data) and last.data == data[len("héllo\n".encode()) + len("wörld\n".encode()) :]
    missing = parse_chunk(bash(run_recipes.tail_log("20250314-120000-0001", offset=0), tmp_path).stdout)
    assert missing == LogChunk(end=0, size=0, data=b"")


# -- tails -----------------------------------------------------------------------------------------------


def test_cursor_yields_whole_lines_and_resumes_after_a_partial_one():
    cursor = TailCursor()
    assert cursor.take(LogChunk(end=9, size=9, data=b"one\ntwo-p")) == ["one"]
    assert cursor.offset == 4
    assert cursor.take(LogChunk(end=13, size=13, data=b"two-part\nthr")) == ["two-part"]
    assert cursor.take(LogChunk(end=16, size=16, data=b"three")) == []
    assert cursor.take(LogChunk(end=16, size=16, data=b"three"), final=True) == ["three"]
    assert cursor.offset == 16


def test_cursor_lets_through_a_line_longer_than_a_read():
    cursor = TailCursor(max_bytes=4)
    assert cursor.take(LogChunk(end=4, size=10, data=b"abcd")) == ["abcd"]
    assert cursor.offset == 4


def test_chunk_parse_rejects_foreign_output():
    assert parse_chunk("bash: line 1: no such thing\n") is None
    encoded = base64.b64encode(b"x\n").decode()
    assert parse_chunk(f"end=2 size=2\n{encoded}\n") == LogChunk(2, 2, b"x\n")


# -- events ----------------------------------------------------------------------------------------------

STEP_LINE = json.dumps(
    {
        "t": 100.0,
        "kind": "step",
        "process": 1,
        "step": 3,
        "loss": 0.5,
        "time/train/step_s": 12.5,
        "time/train/step_avg_last10_s": 12.0,
        "time/train/rollout_generate_s": 9.1,
        "throughput/train/valid_tokens_per_s": 2293.0,
        "memory/train/bytes_in_use_max_gib": None,
        "memory/train/peak_bytes_in_use_max_gib": 20.5,
        "train-reward/total/mean": 0.25,
    }
)


def test_step_event_to_metrics():
    event = parse_event_line(STEP_LINE)
    assert event and event.kind == "step" and event.process == 1 and event.t == 100.0
    summary = EventSummary().add([event])
    step = summary.last_step
    assert (step.step, step.step_s, step.step_avg_last10_s, step.tokens_per_s) == (3, 12.5, 12.0, 2293.0)
    assert step.mem_in_use_gib is None and step.mem_peak_gib == 20.5 and step.reward_mean == 0.25
    assert step.phases == {"rollout_generate": 9.1}


def test_partial_and_foreign_lines_are_skipped():
    text = "\n".join(
        [
            '{"t": 1, "kind": "start", "process": 0, "config_digest": "abc"}',
            "not json",
            '["a list"]',
            '{"no_kind": 1}',
            STEP_LINE,
            STEP_LINE[:40],  # cut short while being written
        ]
    )
    assert [e.kind for e in parse_events(text)] == ["start", "step"]
    # the end of a longer file: the first line may be the tail of a line
    assert [e.kind for e in parse_events('kind": "x"}\n' + STEP_LINE + "\n", starts_mid_line=True)] == [
        "step"
    ]


def test_error_message_with_hint():
    summary = EventSummary().add(
        parse_events(
            '{"kind": "error", "message": "RESOURCE_EXHAUSTED", "hint": "reduce rollout.batch_size"}\n'
            '{"kind": "warning", "message": "w"}\n'
        )
    )
    assert summary.error_message == "RESOURCE_EXHAUSTED (reduce rollout.batch_size)"
    assert summary.warnings == 1


# -- monitor ---------------------------------------------------------------------------------------------


def test_monitor_pending_running_succeeded():
    monitor = RunMonitor(RUN, [0, 1])
    assert monitor.state is RunState.PENDING
    monitor.observe(0, RunProbe(RUN, pgid=10, alive=True))
    assert monitor.workers[0].state is WorkerState.RUNNING and monitor.state is RunState.RUNNING
    monitor.observe(0, RunProbe(RUN, pgid=10, exit_status=0, exit_time=5.0))
    monitor.observe(1, RunProbe(RUN, pgid=11, exit_status=0, exit_time=6.0))
    assert monitor.state is RunState.SUCCEEDED and monitor.all_done and monitor.failure_message() is None


def test_monitor_names_the_first_failing_worker_and_its_error():
    monitor = RunMonitor(RUN, [0, 1, 2])
    error = parse_events('{"t": 3, "kind": "error", "process": 2, "message": "boom"}')
    monitor.observe(0, RunProbe(RUN, pgid=1, alive=True))
    monitor.observe(1, RunProbe(RUN, pgid=2, exit_status=1, exit_time=50.0))
    monitor.observe(2, RunProbe(RUN, pgid=3, exit_status=1, exit_time=10.0, events=error))
    assert monitor.state is RunState.PARTIALLY_DEAD  # failed, and worker 0 still runs
    assert monitor.first_failure().worker == 2 and monitor.still_running() == [0]
    assert monitor.failure_message() == "worker 2 exited 1: boom"
    monitor.observe(0, RunProbe(RUN, pgid=1, exit_status=143, exit_time=60.0))
    assert monitor.state is RunState.FAILED and monitor.first_failure().worker == 2


def test_monitor_lost_cases():
    monitor = RunMonitor(RUN, [0, 1, 2], lost_after_unreachable=2)
    monitor.observe(0, RunProbe(RUN, pgid=5, alive=False))  # gone without an exit file
    assert monitor.workers[0].state is WorkerState.LOST
    monitor.observe(1, RunProbe(RUN, missing=True))
    assert monitor.workers[1].state is WorkerState.LOST and "missing" in monitor.workers[1].reason
    monitor.observe_unreachable(2, "unreachable: connection refused")
    assert monitor.workers[2].state is WorkerState.PENDING
    monitor.observe_unreachable(2, "unreachable: connection refused")
    assert monitor.workers[2].state is WorkerState.LOST
    monitor.observe(2, RunProbe(RUN, pgid=7, alive=True))  # it answered again
    assert monitor.workers[2].state is WorkerState.RUNNING
    assert monitor.state is RunState.PARTIALLY_DEAD and monitor.failure_message().startswith("worker 0 lost")


def test_monitor_exited_is_final_and_stop_gives_stopped():
    monitor = RunMonitor(RUN, [0])
    monitor.observe(0, RunProbe(RUN, pgid=1, exit_status=143, exit_time=1.0))
    monitor.observe(0, RunProbe(RUN, missing=True))
    assert monitor.workers[0].state is WorkerState.EXITED and monitor.workers[0].exit_status == 143
    monitor.stop_requested = True
    assert monitor.state is RunState.STOPPED


def test_a_stop_asked_for_is_no_failure_unless_a_worker_failed_before_it():
    stopped_at = datetime.fromtimestamp(100.0, UTC)
    monitor = RunMonitor(RUN, [0, 1])
    monitor.observe(0, RunProbe(RUN, pgid=1, alive=True))
    monitor.observe(1, RunProbe(RUN, pgid=2, alive=True))
    monitor.note_stop(stopped_at)
    monitor.observe(0, RunProbe(RUN, pgid=1, exit_status=143, exit_time=101.0))
    # worker 0 ended by the stop, worker 1 not yet: a run being stopped, not partially dead
    assert monitor.state is RunState.RUNNING and monitor.workers[0].stopped and not monitor.workers[0].failed
    monitor.observe(1, RunProbe(RUN, pgid=2, exit_status=137, exit_time=110.0))
    assert monitor.state is RunState.STOPPED
    assert monitor.first_failure() is None and monitor.failure_message() is None

    # A worker that had failed on its own before the stop stays the run's first failure.
    monitor = RunMonitor(RUN, [0, 1])
    monitor.observe(0, RunProbe(RUN, pgid=1, exit_status=1, exit_time=50.0))
    monitor.observe(1, RunProbe(RUN, pgid=2, alive=True))
    monitor.note_stop(stopped_at)
    monitor.observe(1, RunProbe(RUN, pgid=2, exit_status=143, exit_time=102.0))
    assert monitor.state is RunState.STOPPED
    assert monitor.failure_message() == "worker 0 exited 1" and monitor.workers[1].stopped


def test_a_stopped_worker_reads_stopped_in_health():
    from tpu_console.observe.health import Activity, assess

    monitor = RunMonitor(RUN, [0, 1])
    monitor.note_stop(datetime.fromtimestamp(100.0, UTC))
    monitor.observe(0, RunProbe(RUN, pgid=1, exit_status=143, exit_time=101.0))
    monitor.observe(1, RunProbe(RUN, pgid=2, exit_status=143, exit_time=101.0))
    health = assess(monitor, {}, now=200.0)
    assert health.state == "stopped" and health.failure is None and health.first_failure is None
    assert {h.activity for h in health.workers.values()} == {Activity.STOPPED} and not health.hung


# -- the inputs a job reads ------------------------------------------------------------------------------


def tiny(**sets: str):
    from trainer.config import load_config

    config = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"
    return load_config(config, [f"{k}={v}" for k, v in sets.items()])


def test_job_inputs_lists_local_paths_and_refuses_what_cannot_be_right_anywhere():
    from tpu_console.launch.inputs import JobInput, job_inputs

    assert job_inputs(tiny()) == [
        JobInput("model_path", "~/tiny-qwen2", "exists"),
        JobInput("data.path", "~/gsm8k-synthetic.jsonl", "file"),
    ]
    remote = tiny(**{"model_path": "Qwen/Qwen2.5-0.5B-Instruct", "data.path": "openai/gsm8k",
                     "checkpoint.dir": "gs://my-bucket/ckpt"})
    assert job_inputs(remote) == []
    with_dir = job_inputs(tiny(**{"checkpoint.dir": "/mnt/ck"}))
    assert with_dir[-1] == JobInput("checkpoint.dir", "/mnt/ck", "writable")
    for key, value, said in (
        ("model_path", "Qwen--bad", "nor a well-formed hub id"),
        ("data.path", "gs://B/x.jsonl", "not a well-formed gs:// path"),
        ("data.path", "data/gsm8k.jsonl", "is relative, but the job runs in its new run folder"),
        ("checkpoint.dir", "gs://x", "not a well-formed gs:// path"),
    ):
        with pytest.raises(UserError, match=said):
            job_inputs(tiny(**{key: value}))


def test_check_inputs_recipe_reports_what_is_missing_or_unwritable(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "data.jsonl").touch()
    checks = [
        ("model_path", "~/model", "exists"),
        ("data.path", "~/data.jsonl", "file"),
        ("checkpoint.dir", "~/new/ck", "writable"),  # made by the job, under a writable home
    ]
    assert bash(run_recipes.check_inputs(checks), tmp_path).stdout == ""
    checks = [
        ("model_path", "~/no-model", "exists"),
        ("data.path", "~/model", "file"),  # a folder is no data file
        ("checkpoint.dir", "~/data.jsonl/ck", "writable"),  # under a file: nothing can make it
        ("hostile", "~/" + HOSTILE, "exists"),
    ]
    said = bash(run_recipes.check_inputs(checks), tmp_path)
    assert said.returncode == 0 and said.stdout.splitlines() == [
        "@@ input missing model_path",
        "@@ input missing data.path",
        "@@ input unwritable checkpoint.dir",
        "@@ input missing hostile",
    ]
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "new").exists()


# -- store -----------------------------------------------------------------------------------------------


def make_record(run_id: str = RUN, node: str = "pod") -> RunRecord:
    return RunRecord(
        run_id=run_id,
        node=node,
        provider="local",
        accelerator_type="local-2x2",
        workers=[0, 1],
        config_path="/x/tiny.yaml",
        config_digest="d" * 64,
        overrides=["steps=2"],
        python="python3",
        started_at=datetime(2025, 3, 14, 12, tzinfo=UTC),
        code_version="abc+dirty",
        worker_records={0: WorkerRecord(0, "pending", 100), 1: WorkerRecord(1, "pending", 101)},
    )


def test_store_round_trip_update_and_listing(tmp_path):
    store = RunStore(tmp_path / "db.sqlite")
    store.add(make_record())
    store.add(make_record("20250315-120000-beef", node="other"))
    got = store.get(RUN)
    assert got.workers == [0, 1] and got.overrides == ["steps=2"] and got.worker_records[1].pgid == 101
    assert not got.finished
    store.update(
        RUN,
        "failed",
        [WorkerRecord(0, "exited", None, None, 0), WorkerRecord(1, "exited", None, None, 3)],
        failure="worker 1 exited 3",
        finished=True,
    )
    store.mark_stop_requested(RUN)
    got = RunStore(tmp_path / "db.sqlite").get(RUN)  # a later console reads the same history
    assert got.state == "failed" and got.finished and got.stop_requested_at is not None
    assert got.worker_records[1].exit_status == 3 and got.worker_records[1].pgid == 101  # pgid kept
    assert [r.run_id for r in store.list()] == ["20250315-120000-beef", RUN]
    assert [r.run_id for r in store.list("pod")] == [RUN]
    with pytest.raises(NotFound, match="unknown run id"):
        store.get("20250101-000000-0000")
