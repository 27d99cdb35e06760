"""The trainer's checkpoint on SIGTERM (trainer/stop.py): the last finished step saved whole before the
process ends with 143, the preemption notice's timing in its event, and a resume from it that goes on
exactly as a run never stopped; on two processes, a signal to one stops both at the same step."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.trainer.launch import launch, read_events, spawn, tiny_config, wait_all
from trainer.checkpoint import Checkpointer
from trainer.stop import PREEMPTION_FILE_ENV

CHECKPOINTS = {"checkpoint.every_steps": 0}  # none but the stop's and the last step's


def wait_for_step(spawned, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(any(e.get("step", 0) >= step for e in read_events(s.run_dir) if e["kind"] == "step")
               for s in spawned):
            return
        assert all(s.proc.poll() is None for s in spawned), [s.log_path.read_text()[-2000:] for s in spawned]
        time.sleep(0.1)
    raise AssertionError(f"no step {step} in {timeout}s")


def losses(events: list[dict]) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events if e["kind"] == "step"}


@pytest.mark.slow
def test_sigterm_saves_the_last_finished_step_and_the_resume_is_exact(tmp_path, tiny_model_dir):
    ckpt = tmp_path / "ckpt"
    config = tiny_config(tmp_path, tiny_model_dir, steps=40, **{"checkpoint.dir": str(ckpt), **CHECKPOINTS})
    notice = tmp_path / "preemption.json"
    [job] = spawn(tmp_path, config, processes=1, devices=2, distributed=False, tag="stopped",
                  extra_env={PREEMPTION_FILE_ENV: str(notice)})
    wait_for_step([job], 2)
    seen_at = time.time()  # as the job runner does: the notice file first, then SIGTERM
    notice.write_text(json.dumps({"source": "preempted", "value": "TRUE", "seen_at": seen_at,
                                  "deadline": seen_at + 30, "seconds_left": 30}))
    job.proc.send_signal(signal.SIGTERM)
    [stopped] = wait_all([job], timeout=120)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.output[-3000:]
    saved = [e for e in stopped.events if e.get("checkpoint_step")]
    assert len(saved) == 1, stopped.output[-3000:]
    step = saved[0]["checkpoint_step"]
    assert step == max(losses(stopped.events))  # the last step made, not one before
    assert saved[0]["notice_source"] == "preempted" and 0 < saved[0]["notice_to_checkpoint_s"] < 30
    assert saved[0]["seconds_left"] > 0
    assert stopped.events[-1]["kind"] == "error" and stopped.events[-1]["type"] == "Terminated"
    # complete on disk: the only step there, and orbax reads it back
    assert [p.name for p in ckpt.iterdir() if p.name.isdigit()] == [str(step)]
    assert Checkpointer(str(ckpt), 0, 2).latest_step() == step

    # The resume goes on exactly as a run that was never stopped.
    last = step + 2
    config = tiny_config(tmp_path, tiny_model_dir, steps=last, **{"checkpoint.dir": str(ckpt), **CHECKPOINTS})
    [resumed] = launch(tmp_path, config, processes=1, devices=2, distributed=False, tag="resumed")
    assert resumed.returncode == 0 and f"resumed from checkpoint step {step}" in resumed.output
    config = tiny_config(tmp_path, tiny_model_dir, steps=last, **{"checkpoint.dir": str(tmp_path / "other")})
    [whole] = launch(tmp_path, config, processes=1, devices=2, distributed=False, tag="whole")
    assert whole.returncode == 0, whole.output[-3000:]
    assert list(losses(resumed.events)) == [step + 1, step + 2]
    assert losses(resumed.events) == {s: v for s, v in losses(whole.events).items() if s > step}
    assert {s: v for s, v in losses(stopped.events).items()} == {
        s: v for s, v in losses(whole.events).items() if s <= step}


@pytest.mark.slow
def test_a_signal_to_one_of_two_processes_stops_both_at_the_same_step_with_one_checkpoint(
        tmp_path, tiny_model_dir):
    ckpt = tmp_path / "ckpt"
    config = tiny_config(tmp_path, tiny_model_dir, steps=40, **{"checkpoint.dir": str(ckpt), **CHECKPOINTS})
    procs = spawn(tmp_path, config, processes=2, devices=1, distributed=True)
    wait_for_step(procs, 1)
    procs[1].proc.send_signal(signal.SIGTERM)  # the other learns it at the step's end
    results = wait_all(procs, timeout=120)
    steps = set()
    for result in results:
        assert result.returncode == 128 + signal.SIGTERM, result.output[-3000:]
        [saved] = [e for e in result.events if e.get("checkpoint_step")]
        steps.add(saved["checkpoint_step"])
        assert saved["checkpoint_step"] == max(losses(result.events))
    (step,) = steps
    assert [p.name for p in ckpt.iterdir() if p.name.isdigit()] == [str(step)]
