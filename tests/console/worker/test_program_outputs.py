"""Real programs' recorded output read as the job runner reads it (worker/step_lines.py): for every
`program_outputs/<name>.log` (the raw bytes a real run wrote, `\\r` and `\\b` kept) and its `<name>.json`
(what the program itself made: `steps`, `step_time_s`, its last `loss`; benchmarks/programs/record.py),
the log is split as job_runner.StepFeed splits it and read with format auto, and the steps seen must be
the steps made exactly, none twice, the step time within 10% of the program's own (where it prints none: of
the one its step lines' own times give, or none where they give none), and the last loss the program
printed the last loss seen."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.console.worker.test_job_runner_steps import run_folder, run_job, stand_in  # noqa: F401 - fixture
from tpu_console.worker import step_lines
from tpu_console.worker.log_timestamps import timestamp
from tpu_console.worker.step_lines import STEP_S, StepLines, complete_lines, steps_counted
from trainer import telemetry as tm

FOLDER = Path(__file__).resolve().parent / "program_outputs"
RECORDINGS = sorted(path.stem for path in FOLDER.glob("*.log"))
READ_BYTES = 251  # the log arrives in pieces, as the runner reads a growing file: lines and characters cut


def test_the_corpus_holds_recordings_each_with_what_its_program_made():
    assert RECORDINGS, f"no recorded program output in {FOLDER}"
    descriptions = sorted(path.stem for path in FOLDER.glob("*.json"))
    assert descriptions == RECORDINGS, "each <name>.log needs its <name>.json and each .json its .log"


def read_as_the_runner_does(data: bytes) -> tuple[list[dict], StepLines]:
    """The events of a log fed in pieces (a line cut at a piece's end waits for the rest), then the end.
    A recording keeps no time of arrival: every line is read at the same moment, with the time it gives
    itself where it gives one."""
    parser = StepLines("auto")
    events: list[dict] = []
    pending = b""
    for start in range(0, len(data), READ_BYTES):
        pending += data[start:start + READ_BYTES]
        lines, used = complete_lines(pending)
        pending = pending[used:]
        for line in lines:
            events += parser.feed(line, now=0.0, written=timestamp(line))
    lines, _ = complete_lines(pending, final=True)
    for line in lines:
        events += parser.feed(line, now=0.0, written=timestamp(line))
    return events + parser.finish(), parser


@pytest.mark.parametrize("name", RECORDINGS)
def test_a_recorded_programs_steps_step_time_and_loss(name):
    made = json.loads((FOLDER / f"{name}.json").read_text())
    events, parser = read_as_the_runner_does((FOLDER / f"{name}.log").read_bytes())
    steps = [e["step"] for e in events]
    assert steps == sorted(set(steps)), f"{name}: a step seen twice or out of order: {steps}"
    seen = steps_counted(events)
    found = parser.format_found
    assert seen == made["steps"], f"{name}: {seen} steps seen ({found} format), {made['steps']} made"
    if made.get("last_step") is not None:
        assert steps[-1] == made["last_step"]
    times = [e[STEP_S] for e in events if e.get(STEP_S) is not None]
    if made.get("step_time_measured") and not made.get("step_time_stamped"):
        # the program prints no step time (the recorder measured the lines' arrival): none is made up from
        # its text; the console's comes from when the step lines arrive, which a recording does not keep
        # (tests/console/worker/test_job_runner_steps.py has a live one)
        assert not times, f"{name} prints no step time, yet {times[:3]} was read"
    elif made.get("step_time_s"):
        assert times, f"{name}: no step time seen; the program's is {made['step_time_s']}"
        assert statistics.median(times) == pytest.approx(made["step_time_s"], rel=0.10)
    losses = [e[tm.LOSS] for e in events if e.get(tm.LOSS) is not None]
    if made["has_loss"]:
        assert losses and losses[-1] == pytest.approx(made["loss"], rel=1e-9, abs=1e-12), (name, losses[-3:])
    else:
        assert not losses, f"{name} prints no loss, yet {losses[:3]} was read"


def test_the_pieces_do_not_change_what_is_read():
    """A whole log read at once gives the same steps as the same log read in pieces (a redraw cut in two
    is one line once its end arrives)."""
    for name in RECORDINGS:
        data = (FOLDER / f"{name}.log").read_bytes()
        whole = StepLines("auto")
        lines, _ = complete_lines(data, final=True)
        events = [e for line in lines for e in whole.feed(line, now=0.0, written=timestamp(line))]
        events += whole.finish()
        assert [e["step"] for e in events] == [e["step"] for e in read_as_the_runner_does(data)[0]], name
        assert step_lines.steps_counted(events) == json.loads((FOLDER / f"{name}.json").read_text())["steps"]


# Writes a recording to its output a piece at a time (each line end its own write), as the program did.
REPLAY = """\
import re, sys, time
data = open("recording.log", "rb").read()
for piece in re.split(rb"(?<=[\\r\\n])", data):
    sys.stdout.buffer.write(piece)
    sys.stdout.buffer.flush()
    time.sleep(0.001)
"""


@pytest.mark.parametrize("name", RECORDINGS)
def test_the_job_runner_reads_each_recording_as_it_is_written(tmp_path, stand_in, name):  # noqa: F811
    """The job runner itself (worker/job_runner.py, run as on a worker) over a program that writes the
    recording as it was written: the same steps and losses as above."""
    folder = run_folder(tmp_path, {"kind": "command", "command": ["python", "foreign.py"],
                                   "metrics": {"format": "auto"}})
    (folder / "foreign.py").write_text(REPLAY)
    (folder / "recording.log").write_bytes((FOLDER / f"{name}.log").read_bytes())
    assert run_job(folder, stand_in) == 0
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    expected, _ = read_as_the_runner_does((FOLDER / f"{name}.log").read_bytes())
    assert [e["step"] for e in events] == [e["step"] for e in expected]
    assert [e.get(tm.LOSS) for e in events] == [e.get(tm.LOSS) for e in expected]
    if json.loads((FOLDER / f"{name}.json").read_text()).get("step_time_stamped"):  # timed as its lines say
        assert [e.get(STEP_S) for e in events] == [e.get(STEP_S) for e in expected]
    assert steps_counted(events) == json.loads((FOLDER / f"{name}.json").read_text())["steps"]
