"""Step lines of foreign programs (worker/step_formats.py, worker/step_lines.py): every built-in format with
the prefixes loggers add, JSON lines, a job file's regex, "auto" keeping to the format it found, and lines
that are no step."""

from __future__ import annotations

import math
import statistics
import time

import pytest

from tpu_console.worker import step_formats, step_lines
from tpu_console.worker.step_formats import BadStepRegex, check_step_regex, without_escapes
from tpu_console.worker.step_lines import StepLines, complete_lines
from trainer import telemetry as tm

# The bundled trainer's own human line (trainer/telemetry.py human_step_line), which the seeds' program
# prints too, with PRINT_TRAIN_TIME_BREAKDOWN=1's phase fields.
SEEDS = (
    "step=3 loss=0.01 entropy=6.6 kl=0 reward_mean=0.5 dt=12.34s rollout_generate=9.10s reward=0.01s "
    "advantages=0.02s shard=0.10s update=3.00s tokens_per_s=2293"
)
# MaxText's metric logger through absl's prefix, as MaxText prints it today, and its older short line.
MAXTEXT = (
    "I0804 08:14:00.000000 140 metric_logger.py:196] completed step: 9, seconds: 0.397, "
    "TFLOP/s/device: 231.178, Tokens/s/device: 20628.591, total_weights: 65536, loss: 10.191, "
    "lm_loss: 10.191, perplexity: 26620.0"
)
MAXTEXT_OLD = "completed step: 4, seconds: 1.250, TFLOP/s: 98.500, loss: 7.125"


def test_seeds_line_with_phases_maps_onto_the_trainers_names():
    metrics = step_formats.parse_seeds("2026-01-24 10:57:31 [rank0] INFO " + SEEDS)
    assert metrics == {
        "step": 3, tm.LOSS: 0.01, tm.ENTROPY: 6.6, tm.KL: 0.0, tm.REWARD_MEAN: 0.5,
        tm.phase_key("step"): 12.34, tm.phase_key("rollout_generate"): 9.10, tm.phase_key("reward"): 0.01,
        tm.phase_key("advantages"): 0.02, tm.phase_key("shard"): 0.10, tm.phase_key("update"): 3.00,
        tm.VALID_TOKENS_PER_S: 2293.0,
    }


def test_the_bundled_trainers_human_line_is_a_seeds_line():
    values = {tm.STEP: 7, tm.LOSS: 0.5, tm.ENTROPY: 1.5, tm.KL: None, tm.REWARD_MEAN: 0.25,
              tm.VALID_TOKENS_PER_S: 100.0, **{tm.phase_key(p): 0.5 for p in tm.PHASES}}
    metrics = step_formats.parse_seeds(tm.human_step_line(values))
    assert metrics[tm.KL] is None  # `kl=null`
    assert {k: metrics[k] for k in values if k != tm.KL} == {k: v for k, v in values.items() if k != tm.KL}


@pytest.mark.parametrize(
    "line", ["step=3", "resuming at step=3 of 10", "global_step=3 loss=1", "nostep=1 x=2"]
)
def test_not_a_seeds_line(line):
    assert step_formats.parse_seeds(line) is None


def test_maxtext_lines_with_and_without_a_logger_prefix():
    assert step_formats.parse_maxtext(MAXTEXT) == {
        "step": 9, tm.phase_key("step"): 0.397, "perf/per_device_tflops_per_sec": 231.178,
        "perf/per_device_tokens_per_sec": 20628.591, "total_weights": 65536.0, tm.LOSS: 10.191,
        "lm_loss": 10.191, "perplexity": 26620.0,
    }
    assert step_formats.parse_maxtext(MAXTEXT_OLD) == {
        "step": 4, tm.phase_key("step"): 1.25, "perf/per_device_tflops_per_sec": 98.5, tm.LOSS: 7.125
    }
    assert step_formats.parse_maxtext("Started training. completed steps: none") is None


def test_json_lines_with_a_step_key():
    line = 'metrics | {"step": 12, "loss": 0.5, "step_time_s": 2.0, "rollout_s": 1.5, "lr": 1e-5, ' \
           '"samples_per_s": 64, "name": "x", "time/train/update_s": 0.25, "bad": NaN}'
    assert step_formats.parse_jsonl(line) == {
        "step": 12, tm.LOSS: 0.5, tm.phase_key("step"): 2.0, tm.phase_key("rollout"): 1.5, "lr": 1e-5,
        "samples_per_s": 64, tm.phase_key("update"): 0.25, "bad": None,
    }
    assert step_formats.parse_jsonl('{"step": "3", "loss": 1}') is None
    assert step_formats.parse_jsonl('{"step": 1.5}') is None
    assert step_formats.parse_jsonl('{"loss": 1}') is None
    assert step_formats.parse_jsonl('{"t": 1, "kind": "eval", "step": 3}') is None
    assert step_formats.parse_jsonl('{"step": 3, "loss"') is None  # cut short


def test_a_job_files_regex():
    parser = StepLines("regex", r"it (?P<step>\d+)/\d+ .*loss (?P<loss>[\d.]+) .*took (?P<dt>[\d.]+)s")
    event = parser.event("[train] it 40/100 | loss 2.5 | took 0.75s", now=5.0)
    assert event == {"t": 5.0, "kind": "step", "process": 0, "source": "output.log", "format": "regex",
                     "step": 40, tm.LOSS: 2.5, tm.phase_key("step"): 0.75, tm.STEP_AVG_LAST10: 0.75}
    assert parser.event("it 41/100 no numbers") is None


@pytest.mark.parametrize(
    ("pattern", "says"),
    [(r"loss (?P<loss>\d+)", "no named group `step`"), (r"step (?P<step>\d+", "does not compile"),
     (r"step (\d+)", "no named group `step`")],
)
def test_a_bad_regex_is_refused_with_the_fix(pattern, says):
    with pytest.raises(BadStepRegex, match=says):
        check_step_regex(pattern)


def test_auto_finds_the_format_keeps_it_and_averages_the_last_ten_step_times():
    parser = StepLines("auto", process=1)
    assert parser.event("Loading checkpoint shards: 100%") is None
    assert parser.format_found is None
    times = [1.0] * 10 + [3.0]
    events = [parser.event(f"completed step: {i}, seconds: {s:.3f}, loss: 1.0") for i, s in enumerate(times)]
    assert parser.format_found == "maxtext" and all(e["format"] == "maxtext" for e in events)
    assert events[0]["process"] == 1 and events[0][tm.STEP_AVG_LAST10] == 1.0
    assert events[-1][tm.STEP_AVG_LAST10] == pytest.approx(1.2)  # the last ten: nine 1.0 and one 3.0
    assert parser.event(SEEDS) is None  # a program keeps to one format: a stray line of another is no step
    assert (parser.lines_read, parser.steps_found) == (13, 11)


def test_none_reads_nothing_and_an_unknown_format_is_refused():
    assert StepLines("none").event(SEEDS) is None
    with pytest.raises(ValueError, match="unknown metrics format"):
        StepLines("csv")


# ---- the lines real programs print, and the lines that are no step -------------------------------------


def read(lines, parser=None):
    """Every event of `lines` through one StepLines (format auto), the job's end included."""
    parser = parser or StepLines("auto")
    events = [e for line in lines for e in parser.feed(line, now=1.0)]
    return events + parser.finish()


@pytest.mark.parametrize(
    ("line", "metrics"),
    [
        ("step 5 | loss 0.123 | 0.21 s/step", {"step": 5, tm.LOSS: 0.123, tm.phase_key("step"): 0.21}),
        ("iter 10: loss 3.2100, time 120.50ms, mfu 12.34%",  # nanoGPT
         {"step": 10, tm.LOSS: 3.21, tm.phase_key("step"): pytest.approx(0.1205), "mfu": 12.34}),
        ("Step 100/1000, loss=0.5012, lr=1.00e-04", {"step": 100, tm.LOSS: 0.5012, "lr": 1e-4}),
        ("[rank0]: step 7 | loss 0.5 | lr 3e-4 | data 5ms", {"step": 7, tm.LOSS: 0.5, "lr": 3e-4,
                                                             tm.phase_key("data"): 0.005}),
        ("I1127 peft_trainer.py:488] Train step 3 training loss: 5.301113  - training perplexity: 200.559921",
         {"step": 3, "training_loss": 5.301113, tm.LOSS: 5.301113, "training_perplexity": 200.559921}),
    ],
)
def test_hand_written_loop_lines(line, metrics):
    assert step_formats.parse_loop(line) == metrics


@pytest.mark.parametrize(
    "line",
    [
        "step 0: train loss 4.1746, val loss 4.1719",  # nanoGPT's evaluation
        "Eval at step 10: val_loss=1.2345, val_acc=0.500",
        "resuming from step 40 (checkpoints/step_40.npz, val_loss=2.3000)",
        "saving checkpoint at step 20, loss 0.5",
        "Restored step 100",
        "step 5",
        "global_step 3 loss 1",
        "tokens per iteration will be: 8,192",
        "Train step 10 eval loss: 5.032121 - eval perplexity: 153.257751",  # tunix
        "Running evaluation on train step 10.",
    ],
)
def test_lines_about_something_else_are_no_loop_step(line):
    assert step_formats.parse_loop(line) is None


def test_a_line_without_its_own_step_time_waits_for_a_second_of_its_kind():
    parser = StepLines("auto")
    assert parser.feed("Step 41/100, loss=2.1000, lr=4.98e-01") == []  # one line: no evidence yet
    assert parser.format_found is None
    events = parser.feed("Step 42/100, loss=2.0500, lr=4.97e-01")  # rising, same shape: both are steps
    assert [(e["step"], e[tm.LOSS], e["format"]) for e in events] == [(41, 2.1, "loop"), (42, 2.05, "loop")]
    assert parser.format_found == "loop" and parser.steps_found == 2


def test_a_json_config_dump_with_a_step_before_maxtext_lines_is_no_step():
    lines = ['{"model": "tiny", "step": 0, "steps": 10, "learning_rate": 0.001}', "Config param steps: 10"]
    lines += [f"I0804 metric_logger.py:196] completed step: {i}, seconds: 0.5, loss: {9 - i}.0"
              for i in range(3)]
    events = read(lines)
    assert [(e["step"], e["format"]) for e in events] == [(0, "maxtext"), (1, "maxtext"), (2, "maxtext")]
    assert "learning_rate" not in events[0]


def test_a_restore_message_before_seeds_lines_records_no_step():
    lines = ["restoring checkpoint", "step=100 lr=0.0003 restored=1"]
    lines += [f"step={i} loss=0.5 entropy=1.0 dt=0.25s" for i in (101, 102)]
    lines += ["step=100 lr=0.0003 restored=1"]  # said again later: still not a step
    events = read(lines)
    assert [e["step"] for e in events] == [101, 102] and all(e["format"] == "seeds" for e in events)


def test_an_eval_line_between_steps_is_no_step_and_the_steps_stay_exact():
    lines = []
    for i in range(1, 7):
        lines.append(f"step={i} loss={1 / i:.3f} dt=0.10s")
        if i % 3 == 0:
            lines.append(f"step={i} eval_accuracy=0.5 eval_loss=0.9")  # MaxText-like eval, seeds-shaped
    events = read(lines)
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5, 6]
    assert all("eval_accuracy" not in e for e in events)


def test_a_steps_last_line_with_fewer_fields_is_still_a_step():
    events = read(["step=1 loss=1.0 entropy=1.5 dt=0.30s", "step=2 loss=0.5 entropy=1.4 dt=0.30s",
                   "step=3 loss=0.2 dt=0.30s"])
    assert [e["step"] for e in events] == [1, 2, 3]


def test_a_later_kind_with_more_support_replaces_an_early_guess_once_that_has_gone_quiet():
    lines = ['{"step": 1, "warmup_lr": 0.1}', '{"step": 2, "warmup_lr": 0.2}']  # an early guess: jsonl
    lines += [f"iter {i}: loss {1 / i:.3f}" for i in range(1, 7)]  # the real steps, numbered afresh
    events = read(lines)
    # what the guess emitted stays (an event is never taken back); the loop takes over past its last step
    assert [(e["step"], e["format"]) for e in events] == [
        (1, "jsonl"), (2, "jsonl"), (3, "loop"), (4, "loop"), (5, "loop"), (6, "loop")]


def test_a_regex_or_a_named_format_reads_only_its_lines():
    events = read(["step 1 | loss 0.5 | 0.2 s/step", "completed step: 1, seconds: 0.5", "step 2 | loss 0.4"],
                  StepLines("loop"))
    assert [(e["step"], e["format"]) for e in events] == [(1, "loop"), (2, "loop")]
    assert read(["step 1 | loss 0.5 | 0.2 s/step"], StepLines("keras")) == []


def test_a_restarted_job_counts_its_steps_afresh():
    parser = StepLines("auto")
    first = read([f"step {i} | loss 0.5 | 0.2 s/step" for i in (1, 2, 3)], parser)
    again = read([f"step {i} | loss 0.4 | 0.2 s/step" for i in (3, 4)], parser)  # resumed from step 2
    assert [e["step"] for e in first] == [1, 2, 3] and [e["step"] for e in again] == [3, 4]


# ---- progress bars: \r and \b redraws, each step once ----------------------------------------------------


def split(data: bytes) -> list[str]:
    return complete_lines(data, final=True)[0]


def test_complete_lines_ends_a_line_at_newline_carriage_return_and_backspaces():
    data = b"a\r\nb\rc\x08\x08\x08d\ne"
    assert complete_lines(data) == (["a", "b", "c", "d"], len(data) - 1)  # `e` waits for its end
    assert complete_lines(data, final=True) == (["a", "b", "c", "d", "e"], len(data))
    assert complete_lines(b"x" * (step_lines.MAX_LINE + 1)) == (["x" * (step_lines.MAX_LINE + 1)],
                                                                 step_lines.MAX_LINE + 1)


def bar(n, total, rate="4.50it/s", desc="", post=""):
    percent = 100 * n // total
    return f"\r{desc}{percent:3d}%|{'#' * (percent // 10):10s}| {n}/{total} [00:01<00:03, {rate}{post}]"


def test_a_bare_tqdm_bar_redrawn_with_carriage_returns_counts_each_step_once():
    data = bar(0, 5, "?it/s") + bar(2, 5) + bar(2, 5) + bar(4, 5, "2.00s/it") + bar(5, 5) + bar(5, 5) + "\n"
    events = read(split(data.encode()))
    assert [e["step"] for e in events] == [2, 4, 5]  # a bar redrawn every 0.1 s skips counts it made
    assert step_lines.steps_counted(events) == 5
    assert events[1][tm.phase_key("step")] == 2.0  # s/it
    assert events[0][tm.phase_key("step")] == pytest.approx(1 / 4.5)  # it/s


def test_bars_of_data_loading_validation_and_sanity_checks_are_no_steps():
    descriptions = ("Loading checkpoint shards: ", "Sanity Checking DataLoader 0: ", "Validation: ")
    out = "".join(bar(n, 2, desc=desc) for desc in descriptions for n in (1, 2))
    out += "\rMap: 100%|##########| 1000/1000 [00:00<00:00, 5000.00 examples/s]\n"
    lines = split(out.encode())
    assert read(lines) == []


def test_lightning_epochs_continue_the_count_and_its_validation_bar_is_no_step():
    out, loss = "", "nan"
    for epoch in range(2):
        desc = f"Epoch {epoch}: "
        out += bar(0, 3, "?it/s", desc, f", v_num=1, train_loss={loss}")
        for n in range(1, 4):
            out += bar(n, 3, desc=desc, post=f", v_num=1, train_loss={loss}")  # drawn, then its loss
            loss = f"{epoch}.{n}"
            out += bar(n, 3, desc=desc, post=f", v_num=1, train_loss={loss}")
        out += "\n" + "".join(bar(n, 2, desc="Validation DataLoader 0: ") for n in (1, 2))
        out += bar(3, 3, desc=desc, post=f", v_num=1, train_loss={loss}, val_loss=0.5")
        out += bar(0, 3, "?it/s", desc) + bar(0, 3, "?it/s", f"Epoch {epoch + 1}: ")  # the bar reset
    events = read(split(out.encode()))
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5, 6]
    assert [e[tm.LOSS] for e in events] == [0.1, 0.2, 0.3, 1.1, 1.2, 1.3]  # train_loss, the last redraw's
    assert events[2]["val_loss"] == 0.5 and "v_num" not in events[2]



def rich_row(epoch, n, total, rate="100.00", desc=None, metrics="v_num: 0.000"):
    """A row of Lightning's Rich bar as Rich draws it into a terminal (its colours kept)."""
    desc = f"Epoch {epoch}/1 " if desc is None else desc
    return (f"{desc} \x1b[35m━━━━━━\x1b[0m\x1b[90m╺━━━━\x1b[0m {n}/{total} \x1b[2m0:00:00 • 0:00:01\x1b[0m "
            f"\x1b[2;4m{rate}it/s\x1b[0m \x1b[3m{metrics}\x1b[0m")


def redraw(*rows, above=2):
    """One redraw of Rich's live display: back up over the `above` rows drawn before, erasing each, then
    the rows (metrics that do not fit its 80 columns wrap onto indented rows)."""
    return "\r\x1b[2K" + "\x1b[1A\x1b[2K" * (above - 1) + "\n".join(rows)


def wrapped(text):
    return " " * 50 + f"\x1b[3m{text}\x1b[0m"


def test_without_escapes_removes_colours_cursor_movements_erasures_and_hyperlinks():
    assert without_escapes("\x1b[2K\x1b[1A\x1b[2KEpoch \x1b[2;4m3.52it/s\x1b[0m\x1b[?25l") == "Epoch 3.52it/s"
    link = "\x1b]8;id=1;https://x.org\x1b\\docs\x1b]8;;\x1b\\"
    assert without_escapes(f"{link} \x1b]0;title\x07\x1b(B\x1b[mok") == "docs ok"


def test_lightnings_rich_bar_redrawn_live_counts_each_step_once_and_reads_its_wrapped_metrics():
    out = "\x1b[?25l" + rich_row(0, 1, 2, "0.00", desc="Sanity Checking") + redraw(
        rich_row(0, 0, 3, "0.00"), wrapped("val_loss: 3.380"), above=1)  # the sanity check's loss
    out += redraw(rich_row(0, 1, 3), wrapped("train_loss: 0.9"))
    out += redraw(rich_row(0, 3, 3), wrapped("train_loss: 0.7"))  # 2 was never drawn
    out += redraw(rich_row(0, 3, 3), wrapped("train_loss: 0.7"),
                  rich_row(0, 1, 2, "50.00", desc="Validation DataLoader 0"))
    out += redraw(rich_row(1, 2, 3, metrics="v_num: 0.000 train_loss:"), wrapped("0.4"), above=3)
    out += redraw(rich_row(1, 3, 3), wrapped("train_loss: 0.3"), wrapped("val_loss: 0.2"))
    out += "\n\x1b[?25h"
    events = read(split(out.encode()))
    assert [(e["step"], e[tm.LOSS]) for e in events] == [(1, 0.9), (3, 0.7), (5, 0.4), (6, 0.3)]
    assert step_lines.steps_counted(events) == 6
    assert all(e[tm.phase_key("step")] == 0.01 for e in events)  # 100.00it/s
    assert events[-1]["val_loss"] == 0.2 and "v_num" not in events[-1]


def test_a_bar_rate_too_rounded_to_time_a_step_gives_way_to_when_its_lines_came():
    parser = StepLines("auto")
    events = [e for n, now in ((1, 0.0), (2, 20.0), (3, 40.0)) for e in parser.feed(
        without_escapes(rich_row(0, n, 5, "0.05")), now=now)] + parser.finish()  # 18 to 22 s a step
    assert [e["step"] for e in events] == [1, 2, 3]
    assert [e.get(tm.phase_key("step")) for e in events] == [None, 20.0, 20.0]
    events = read([without_escapes(rich_row(0, n, 2, "0.50")) for n in (1, 2)])  # 1.98 to 2.02 s: its own
    assert [e[tm.phase_key("step")] for e in events] == [2.0, 2.0]


def test_hugging_faces_log_dict_goes_to_the_step_its_bar_shows_next_and_its_summary_ends_training():
    out = bar(0, 3, "?it/s") + "[transformers] loss_type=None\n"
    out += bar(1, 3, "2.00s/it") + "\n{'loss': '4.7', 'grad_norm': '1.3', 'learning_rate': '0.001', "
    out += "'epoch': '0.3'}\n" + bar(1, 3, "2.00s/it")  # tqdm.write: the line, then the bar again
    out += bar(2, 3, "2.00s/it") + "\n{'loss': 4.6, 'epoch': 0.6}\n" + bar(2, 3, "2.00s/it")
    out += "\n{'loss': '4.5', 'epoch': '1.0'}\n"  # before the bar showed 3 (tqdm throttles its redraws)
    out += bar(3, 3, "1.90s/it") + "\n{'train_runtime': '6.1', 'train_loss': '4.6', 'epoch': '1.0'}\n"
    out += bar(3, 3, "1.90s/it") + "\n" + bar(1, 3) + bar(2, 3) + bar(3, 3) + "\n"  # evaluate()'s bar, after
    events = read(split(out.encode()))
    assert [(e["step"], e[tm.LOSS]) for e in events] == [(1, 4.7), (2, 4.6), (3, 4.5)]
    assert events[0]["learning_rate"] == 0.001 and events[0]["epoch"] == 0.3
    assert all("train_runtime" not in e and "train_loss" not in e for e in events)


def test_an_evaluation_bar_nested_in_an_unfinished_training_bar_is_no_step():
    out = "".join(bar(n, 20) for n in range(1, 4)) + "\n"
    out += "".join(bar(n, 40) for n in range(1, 41)) + "\n"  # evaluation, more batches than steps so far
    out += "".join(bar(n, 20) for n in range(3, 6)) + "\n"
    events = read(split(out.encode()))
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5]


KERAS_BAR = ("\x1b[1m{n:2d}/10\x1b[0m \x1b[32m━━━━\x1b[0m\x1b[37m━━━━\x1b[0m \x1b[1m0s\x1b[0m {ms}ms/step - "
             "loss: {loss}")


def test_keras_counts_the_steps_of_finished_epochs_and_reads_its_backspace_redraws():
    out = ""
    for epoch in (1, 2):
        out += f"Epoch {epoch}/2\n"
        for n in (1, 2, 3, 5, 10, 10):  # redraws skip counts, and the last is drawn twice
            out += KERAS_BAR.format(n=n, ms=5, loss=f"0.{epoch}{n:02d}") + "\x08" * 70 + "\r"
        out += "\n"
    out += "".join(KERAS_BAR.format(n=n, ms=2, loss="0.5") + "\n" for n in (1, 10))  # evaluate, after fit
    events = read(split(out.encode()))
    assert [e["step"] for e in events] == [1, 2, 3, 5, 10, 11, 12, 13, 15, 20]
    assert step_lines.steps_counted(events) == 20
    assert events[-1][tm.LOSS] == 0.21 and events[-1][tm.phase_key("step")] == 0.005
    assert all(e["format"] == "keras" for e in events)


@pytest.mark.parametrize(
    "head", ["step 5 loss ", "step=5 ", "completed step: 5, ", '{"step": 1, ', "iter 3: ",
             " 5%|#| 1/2 [00:00<00:00, 1.0it/s", "Epoch 0:  5%|#| 1/2 [00:00<00:00, 1.0it/s, loss=",
             " 1/2 ━━ 0s 5ms/step - loss: ", "Epoch 0/1 ━", "Epoch 0/1 ━ 1/2 0:00:00 • ",
             "Epoch 0/1 ━ 1/2 0:00:00 • 0:00:00 1.00it/s v_num: "],
)
@pytest.mark.parametrize("body", [" ", "a", "1", "a1 ", "a=1 ", "a: ", "5%|", "1."])
def test_a_long_line_is_read_in_time_proportional_to_its_length(head, body):
    """No pattern backtracks over a long run of one kind of character (40 kB read in far under a second; a
    quadratic pattern takes minutes)."""
    line = head + body * (40000 // len(body)) + "x"
    started = time.monotonic()
    StepLines("auto").feed(line)
    assert time.monotonic() - started < 3.0


def test_a_bars_open_step_is_written_once_nothing_has_added_to_it_for_a_while():
    parser = StepLines("auto")
    for n, now in ((1, 0.0), (2, 1.0)):
        parser.feed(bar(n, 5), now=now)
    assert parser.idle(now=1.0 + step_lines.OPEN_S - 0.5) == []  # step 2 may still get its redraws
    parser.feed(bar(2, 5, post=", loss=0.5"), now=2.0)  # a redraw adds to it and restarts the wait
    assert parser.idle(now=1.0 + step_lines.OPEN_S) == []
    [written] = parser.idle(now=2.0 + step_lines.OPEN_S)
    assert (written["step"], written[tm.LOSS], written["t"]) == (2, 0.5, 1.0)  # when its line came
    assert parser.feed(bar(2, 5, post=", loss=0.4"), now=30.0) == [] and parser.finish() == []  # once


def test_lines_of_ever_new_shapes_are_no_steps_and_are_not_all_kept():
    parser = StepLines("auto")
    lines = [f'{{"step": {i}, "field_{i}": 1}}' for i in range(3 * step_lines.MAX_KINDS)]  # no shape twice
    assert [e for line in lines for e in parser.feed(line)] == []
    assert len(parser._kinds) == step_lines.MAX_KINDS  # what waits for support is bounded
    assert parser.finish() == []


def test_a_step_whose_line_gives_no_time_gets_the_time_per_step_since_the_lines_before_it():
    parser = StepLines("auto")
    events = [e for step, now in ((41, 10.0), (42, 10.5), (43, 11.0), (45, 12.0))
              for e in parser.feed(f"Step {step}/100, loss=0.5, lr=1e-3", now=now)]
    assert [e["step"] for e in events] == [41, 42, 43, 45]
    assert tm.phase_key("step") not in events[0]  # nothing before it
    assert [e[tm.phase_key("step")] for e in events[1:]] == [0.5, 0.5, 0.5]  # (12 - 10) / (45 - 41)
    assert events[-1][tm.STEP_AVG_LAST10] == 0.5
    parser = StepLines("auto")
    same_read = [e for step in (1, 2) for e in parser.feed(f"Step {step}/9, loss=1", now=3.0)]
    assert [e["step"] for e in same_read] == [1, 2]
    assert all(tm.phase_key("step") not in e for e in same_read)  # read at once: no time to tell


def test_fast_steps_are_timed_over_a_span_the_reads_cannot_blur():
    # 15 ms steps whose lines are read every 0.02 s (the runner's pace while output flows): over ten steps
    # (0.135 s) a read's 0.02 s is 15%; over ARRIVAL_SPAN_S (0.25 s) 8% at most
    parser = StepLines("auto")
    events = []
    for step in range(1, 301):
        read_at = math.ceil(step * 0.015 / 0.02) * 0.02
        events += parser.feed(f"Step {step}/300, loss=0.5", now=read_at)
    late = [e[tm.phase_key("step")] for e in events if e["t"] >= step_lines.ARRIVAL_SPAN_S + 0.02]
    assert all(abs(t / 0.015 - 1) <= 0.08 + 1e-9 for t in late), (min(late), max(late))
    assert len(parser._arrived) <= 20  # what a 0.25 s span needs at 67 steps a second, not every step


def test_a_slow_first_step_weighs_only_on_the_steps_within_the_span_after_it():
    parser = StepLines("auto")
    events = parser.feed("Step 1/100, loss=1", now=0.0)
    for step in range(2, 101):  # step 2 took 1 s (compiling), every other 20 ms
        events += parser.feed(f"Step {step}/100, loss=1", now=1.0 + (step - 2) * 0.02)
    times = [e[tm.phase_key("step")] for e in events[1:]]
    assert times[0] == 1.0 and statistics.median(times) == pytest.approx(0.02)


def test_lines_that_give_their_own_time_are_timed_by_it_step_by_step():
    parser = StepLines("auto")
    read_at_once = [(40, 100.0), (41, 100.02), (42, 100.03), (44, 100.07), (45, 100.05), (46, None)]
    events = [e for step, written in read_at_once
              for e in parser.feed(f"Step {step}/100, loss=0.5, lr=1e-3", now=5.0, written=written)]
    assert [e["step"] for e in events] == [40, 41, 42, 44, 45, 46]
    times = [e.get(tm.phase_key("step")) for e in events]
    # each since the step line before it; where one gives none or an earlier one, when they came (at once)
    assert times == [None, pytest.approx(0.02), pytest.approx(0.01), pytest.approx(0.02), None, None]
    assert all("_written" not in e for e in events)  # the line's own time is not written out


def test_an_epoch_bar_whose_last_redraw_was_not_written_still_counts_its_round():
    # tqdm(leave=False) clears its bar at the end instead of drawing the last count
    out = "".join(bar(n, 10, desc="Epoch 0: ") for n in (0, 4, 8)) + "\r" + " " * 40 + "\r"
    out += "".join(bar(n, 10, desc="Epoch 1: ") for n in (0, 3, 7, 10)) + "\n"
    events = read(split(out.encode()))
    assert [e["step"] for e in events] == [4, 8, 13, 17, 20]
    assert step_lines.steps_counted(events) == 20
