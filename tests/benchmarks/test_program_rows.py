r"""benchmarks/program_rows.py, the rules benchmarks/programs.py judges each program by: steps made counted
from a program's own output (a \r redraw once), its step time printed or measured, and the verdict on
what the console saw. No pod and no timing here: the harness itself runs by hand (its docstring)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# benchmarks/ is no package (its scripts run by hand and import their siblings): the module by its path
_spec = importlib.util.spec_from_file_location("program_rows", ROOT / "benchmarks" / "program_rows.py")
rows = sys.modules.setdefault("program_rows", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(rows)

LOOP = r"""
command = ["python", "train.py"]
truth = '(?m)^step (?P<step>\d+) \|'
step_time = '\| (?P<s>[\d.]+) s/step'
loss = '\| loss (?P<loss>[\d.na]+) \|'
"""
OUTPUT = ("config: {'step': 100, 'lr': 0.1}\n"  # a config dump is not a step
          "step 1 | loss 0.9000 | 0.50 s/step\n"
          "step 2 | loss 0.8000 | 0.20 s/step\n"
          "step 3 | loss 0.7000 | 0.22 s/step\n"
          "eval loss 0.6500\n"  # an eval line is neither a step nor the training loss
          "done\n")


def program(tmp_path: Path, text: str = LOOP, name: str = "loop") -> rows.Program:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "program.toml").write_text(text)
    return rows.load_program(folder)


def events(*steps: dict) -> str:
    lines = [json.dumps({"t": 1.0, "kind": "start"})]
    lines += [json.dumps({"t": 2.0, "kind": "step", "format": "loop", **s}) for s in steps]
    return "\n".join(lines) + "\n"


def status(step: int | None, loss: float | None = None) -> dict:
    return {"worker": 0, "last_step": None if step is None else {"step": step, "loss": loss}}


def test_steps_made_count_each_step_once_a_redrawn_bar_included():
    bar = re.compile(r"(?P<step>\d+)/4 \[")
    text = "0/4 [\r1/4 [\r1/4 [\r2/4 [\r3/4 [\r3/4 [\r4/4 [\n"
    assert [s for s, _ in rows.made_steps(text, bar)] == [0, 1, 2, 3, 4]


def test_a_program_that_prints_its_step_time_and_loss(tmp_path):
    made = rows.made(program(tmp_path), OUTPUT, growth=[])
    assert (made.steps, made.count, made.last) == ([1, 2, 3], 3, 3)
    assert made.step_s == pytest.approx(0.22) and not made.step_s_measured  # the median of 0.50, 0.20, 0.22
    assert made.losses == [0.9, 0.8, 0.7]


REDRAWN_BAR = r"""
command = ["python", "train.py"]
truth = 'train: (?P<step>[1-9]\d*)/4 \['
step_time = 'train: [1-9]\d*/4 \[[^,]*, (?P<s>[\d.]+)s/it'
"""


def test_a_bars_step_time_weighs_once_a_step_however_often_it_is_redrawn(tmp_path):
    # tqdm's rate, redrawn with the loss (steps 1 and 2 twice), and its close with the run's average (step 4):
    # the first figure drawn for each step, 9, 3, 1, 0.5: median 2 (every figure drawn would give 3)
    text = ("train: 1/4 [00:09, 9.0s/it]\rtrain: 1/4 [00:09, 9.0s/it, loss=2.9]\r"
            "train: 2/4 [00:12, 3.0s/it]\rtrain: 2/4 [00:12, 3.0s/it, loss=2.8]\r"
            "train: 3/4 [00:13, 1.0s/it, loss=2.7]\rtrain: 4/4 [00:13, 0.5s/it, loss=2.6]\r"
            "train: 4/4 [00:13, 3.3s/it, loss=2.6]\n")
    made = rows.made(program(tmp_path, REDRAWN_BAR, "bar"), text, growth=[])
    assert made.count == 4 and made.step_s == pytest.approx(2.0)


def test_its_step_time_in_ms_and_measured_where_it_prints_none(tmp_path):
    in_ms = program(tmp_path, LOOP.replace(r"(?P<s>[\d.]+) s/step", r"(?P<ms>[\d.]+)ms/step"), "ms")
    assert rows.made(in_ms, "step 1 | 5ms/step\nstep 2 | 7ms/step\n", []).step_s == pytest.approx(0.006)
    silent = program(tmp_path, LOOP.replace("step_time", "#"), "silent")
    text = "step 1 | a\nstep 2 | b\nstep 3 | c\n"
    first, last = text.index("step 1"), text.index("step 3")
    growth = [(1.0, first + 5), (2.5, last), (4.0, len(text))]  # step 1 arrived at 1.0 s, step 3 at 4.0 s
    made = rows.made(silent, text, growth)
    assert made.step_s == pytest.approx(1.5) and made.step_s_measured and not made.step_s_stamped
    assert made.wall_step_s == made.step_s


def test_measured_as_the_console_times_it_a_slow_first_step_weighing_on_the_ten_after_it(tmp_path):
    silent = program(tmp_path, LOOP.replace("step_time", "#"), "silent")
    text = "".join(f"step {n} | x\n" for n in range(1, 41))
    ends = [text.index(f"step {n} |") + 1 for n in range(1, 41)]  # a byte of each step's line
    # step 1 at 0 s, step 2 a second later (compiling), then 0.1 s a step, 39 and 40 in one look
    growth = [(0.0, ends[0])] + [(1.0 + 0.1 * (n - 2), ends[n - 1]) for n in range(2, 39)]
    growth.append((4.8, len(text)))
    made = rows.made(silent, text, growth)
    assert made.step_s == pytest.approx(0.1) and made.step_s_measured and not made.step_s_stamped
    assert made.wall_step_s == pytest.approx(4.8 / 39)  # the first step and the rest averaged: a check


def test_measured_by_the_times_its_step_lines_give_themselves_where_they_give_one(tmp_path):
    absl = program(tmp_path, 'command = ["python"]\ntruth = \'Train step (?P<step>\\d+) training\'\n', "absl")
    text = ("I1127 21:44:59.000000 140 peft_trainer.py:802] Train step 0 eval loss: 5.5\n"
            "I1127 21:44:59.500000 140 peft_trainer.py:488] Train step 1 training loss: 5.4\n"
            "I1127 21:45:00.100000 140 peft_trainer.py:488] Train step 2 training loss: 5.3\n"
            "I1127 21:45:00.700000 140 peft_trainer.py:488] Train step 3 training loss: 5.2\n"
            "I1127 21:45:00.900000 140 peft_trainer.py:802] Running evaluation on train step 4.\n"
            "I1127 21:45:03.700000 140 peft_trainer.py:488] Train step 4 training loss: 5.1\n")
    made = rows.made(absl, text, [(9.0, len(text))])  # it all reached the file at once
    assert made.wall_step_s is None  # no time between them to measure here
    # each step's own time, 0.6, 0.6 and 3.0 s (an evaluation in it): their median, as printed ones'
    assert made.step_s == pytest.approx(0.6) and made.step_s_measured and made.step_s_stamped
    row = rows.Row("absl", workers={0: rows.WorkerResult(made, rows.seen("", None), [])})
    assert "@0.6" in rows.table([row])


def test_what_the_console_saw_from_its_events_and_status():
    seen = rows.seen(events({"step": 1, "time/train/step_s": 0.5, "loss": 0.9},
                            {"step": 2, "time/train/step_s": 0.2},
                            {"step": 3, "time/train/step_s": 0.22, "loss": 0.7}) + '{"kind": "st',
                     status(3, 0.7))
    assert (seen.steps, seen.last, seen.loss, seen.losses, seen.formats) == ([1, 2, 3], 3, 0.7, 2, ["loop"])
    assert seen.step_s == pytest.approx(0.22)


def test_a_console_that_saw_every_step_right_passes(tmp_path):
    made = rows.made(program(tmp_path), OUTPUT, [])
    seen = rows.seen(events(*({"step": s, "time/train/step_s": t, "loss": 1 - s / 10}
                              for s, t in ((1, 0.5), (2, 0.2), (3, 0.23)))), status(3, 0.7))
    assert rows.judge(made, seen) == []


@pytest.mark.parametrize(
    ("steps", "last", "step_s", "loss", "problem"),
    [
        ([1, 2], 2, 0.22, 0.7, "2 step(s) seen, 3 made"),
        ([100, 1, 2, 3], 3, 0.22, 0.7, "1 spurious step(s) seen (100)"),  # the config dump taken for a step
        ([1, 2, 2, 3], 3, 0.22, 0.7, "1 spurious step(s) seen (2)"),  # a redraw counted twice
        ([1, 2, 3], None, 0.22, 0.7, "status shows step -, the last made is 3"),
        ([1, 2, 3], 3, 0.25, 0.7, "step time seen 0.25 s is 14% off the program's 0.22 s"),
        ([1, 2, 3], 3, None, 0.7, "no step time seen"),
        ([1, 2, 3], 3, 0.22, None, "no loss seen (the program's last: 0.7)"),
        ([1, 2, 3], 3, 0.22, 0.65, "loss seen 0.65 != the program's last 0.7"),  # the eval line's taken
    ],
)
def test_each_target_missed_is_named(tmp_path, steps, last, step_s, loss, problem):
    made = rows.made(program(tmp_path), OUTPUT, [])
    seen = rows.seen(events(*({"step": s, "time/train/step_s": step_s} for s in steps)), status(last, loss))
    assert problem in rows.judge(made, seen)


def test_step_time_within_ten_percent_passes_and_a_silent_worker_is_judged_on_its_steps_alone(tmp_path):
    made = rows.made(program(tmp_path), OUTPUT, [])
    seen = rows.seen(events(*({"step": s, "time/train/step_s": 0.24} for s in (1, 2, 3))), status(3, 0.7))
    assert rows.judge(made, seen) == []  # 0.24 against 0.22: +9%
    silent = rows.made(program(tmp_path, name="rank1"), "rank 1 waits\n", [])  # prints nothing of its steps
    assert rows.judge(silent, rows.seen("", status(None))) == []
    assert rows.judge(silent, rows.seen(events({"step": 1}), status(1))) == [
        "1 step(s) seen, 0 made", "1 spurious step(s) seen (1)"]


def test_a_program_whose_loss_is_nan_wants_none_seen(tmp_path):
    nan = OUTPUT.replace("loss 0.7000", "loss nan")
    made = rows.made(program(tmp_path), nan, [])
    assert math.isnan(made.losses[-1])
    seen = rows.seen(events(*({"step": s, "time/train/step_s": 0.22} for s in (1, 2, 3))), status(3, None))
    assert rows.judge(made, seen) == []


BAR = r"""
command = ["python", "t.py"]
steps = 200
step_time = '(?:(?P<s>[\d.]+)s/it|(?P<per_s>[\d.]+)it/s)\]'
"""


def test_a_bar_that_draws_some_of_its_steps_is_judged_by_the_last_step_and_their_order(tmp_path):
    bar = program(tmp_path, BAR)
    text = "\r 37/200 [00:00, 370.00it/s]\r100/200 [00:00, 1.00s/it]\r200/200 [00:01, 400.00it/s]\n"
    made = rows.made(bar, text, [])
    assert (made.steps, made.count, made.last) == (None, 200, 200)
    assert made.step_s == pytest.approx(1 / 370) and not made.step_s_measured  # the median of 1/370, 1, 1/400
    drawn = events(*({"step": s, "time/train/step_s": 0.0025} for s in (37, 100, 200)))
    assert rows.judge(made, rows.seen(drawn, status(200))) == []
    shown_twice = events(*({"step": s, "time/train/step_s": 0.0025} for s in (37, 100, 100, 201)))
    assert rows.judge(made, rows.seen(shown_twice, status(201))) == [
        "status shows step 201, the last made is 200", "2 spurious step(s) seen (100, 201)"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('command = "python train.py"\ntruth = "step (?P<step>\\\\d+)"\n', "`command` must be a list"),
        ('command = ["python"]\ntruth = "step (\\\\d+)"\n', "has no named group `(?P<step>...)`"),
        ('command = ["python"]\ntruth = "step (?P<step>"\n', "does not compile"),
        ('command = ["python"]\n', "neither `truth` nor `steps`"),
        ('command = ["python"]\nsteps = 3\nstep_time = "(?P<sec>1)"\n', "`(?P<us>...)` or `(?P<per_s>...)`"),
        ('command = ["python"]\nsteps = 3\nthruth = "x"\n', "unknown key 'thruth'"),
        ('command = ["python"]\nsteps = 3\npython = "3"\n', "`python` must be a version"),
        ("command = [", "cannot be read as TOML"),
    ],
)
def test_a_program_toml_that_cannot_be_used_is_refused_by_name(tmp_path, text, problem):
    with pytest.raises(rows.BadProgram, match=re.escape(problem)):
        program(tmp_path, text)


def test_the_table_has_a_row_a_program_and_names_each_failure(tmp_path):
    made = rows.made(program(tmp_path), OUTPUT, [])
    good = rows.Row("loop", "jax 0.10.2", format="loop", goodput_pct=41.26,
                    phases_s={"sync": 0.4, "setup": 30.2, "run": 20.0})
    shown = rows.Shown(3, 3, 0.22, 0.7)
    good.workers = {w: rows.WorkerResult(made, rows.seen("", status(None)), [], shown) for w in (0, 1)}
    bad = rows.Row("keras", problems=["setup failed: no matching distribution"])
    assert good.passed and not bad.passed and not rows.Row("empty").passed
    text = rows.table([good, bad])
    lines = text.splitlines()
    assert lines[0].split() == list(rows.COLUMNS)
    assert lines[1].split() == ["loop", "jax", "0.10.2", "3", "3", "0", "-", "3", "0.22", "-", "0.7", "-",
                                "loop", "41.3%", "0s", "30s", "20s", "PASS"]
    assert lines[2].split()[-1] == "FAIL"
    assert "keras: setup failed: no matching distribution" in lines
    assert json.loads(json.dumps([good.to_json(), bad.to_json()]))[1]["problems"] == [
        "setup failed: no matching distribution"]


def test_the_version_comes_from_the_first_requirement(tmp_path):
    (tmp_path / "requirements.txt").write_text("# pinned\n--extra-index-url https://x\ntorch==2.13.0\nnumpy\n")
    assert rows.first_requirement(tmp_path) == "torch"
    assert rows.first_requirement(tmp_path / "none") is None



@pytest.mark.parametrize(
    ("toml", "text", "why"),
    [
        (BAR, "37/200 [00:00, ?it/s]\n", "its step_time matched nothing in its output"),
        ('command = ["python"]\nsteps = 2\n', "",
         "program.toml has no step_time, and no truth to time its steps by"),
        (LOOP.replace("step_time", "#"), "step 1 | loss 1 |\n",
         "it prints no step time, and fewer than two steps to time"),
        (LOOP.replace("step_time", "#"), "step 1 | loss 1 |\nstep 2 | loss 1 |\n",
         "it prints no step time, and its step lines reached output.log all at once"),  # buffered
    ],
)
def test_why_there_is_no_step_time_of_the_programs_own_is_said(tmp_path, toml, text, why):
    made = rows.made(program(tmp_path, toml), text, [(0.0, len(text))])
    assert made.step_s is None
    said = rows.judge(made, rows.seen("", None))
    assert f"no step time of the program's own to compare with: {why}" in said


def dashboard(workers: dict, step_time_drawn: bool = True, third: str | None = "loss") -> dict:
    """dashboard_view.py's document: `third`, the third plot's title (None: not drawn)."""
    return {
        "workers": {str(w): {"steps": n, "last": last, "step_s": s, "loss": loss, "losses": n}
                    for w, (n, last, s, loss) in workers.items()},
        "plots": {
            "plot-step-time": {"drawn": step_time_drawn, "note": None if step_time_drawn else "no steps yet"},
            "plot-reward": {"drawn": third is not None, "note": None if third else "loss\n\nno steps yet"},
        },
        "plot_titles": ["step time (s)", *([third] if third else [])],
    }


def test_the_dashboard_agrees_with_the_steps_the_console_saw_or_each_difference_is_named():
    seen = rows.seen(events(*({"step": s, "time/train/step_s": 0.22, "loss": 0.7} for s in (1, 2, 3))),
                     status(3, 0.7))
    shown = rows.dashboard_shown(dashboard({0: (3, 3, 0.22, 0.7)}))
    assert rows.judge_dashboard(seen, shown[0]) == []
    assert rows.judge_dashboard(seen, None) == ["the dashboard holds no step"]
    assert rows.judge_dashboard(rows.seen("", status(None)), None) == []  # a worker with no step: none held
    wrong = rows.dashboard_shown(dashboard({0: (2, 2, 0.3, None)}))[0]
    assert rows.judge_dashboard(seen, wrong) == [
        "the dashboard holds 2 step(s), the console saw 3",
        "the dashboard's last step is 2, status shows 3",
        "the dashboard's step time is 0.3, the console's 0.22",
        "the dashboard's loss is -, the console's 0.7"]


def test_the_plots_tab_draws_the_step_time_and_the_loss_wherever_the_program_prints_one():
    assert rows.judge_plots(dashboard({}), 3, prints_loss=True) == []
    assert rows.judge_plots(dashboard({}, step_time_drawn=False, third=None), 1, prints_loss=False) == []
    assert rows.judge_plots(dashboard({}, step_time_drawn=False), 3, prints_loss=True) == [
        "the Plots tab draws no step time: no steps yet"]
    assert rows.judge_plots(dashboard({}, third=None), 3, prints_loss=True) == [
        "the Plots tab draws no loss: loss\n\nno steps yet"]
    assert rows.judge_plots(dashboard({}, third="mean reward"), 3, prints_loss=True) == [
        "the Plots tab draws no loss: its third plot is not the loss"]
