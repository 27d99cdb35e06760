"""Step lines of foreign programs (worker/step_lines.py): every built-in format with the prefixes loggers
add, JSON lines, a job file's regex, "auto" keeping to the format it found, and lines that are no step."""

from __future__ import annotations

import pytest

from tpu_console.worker import step_lines
from tpu_console.worker.step_lines import BadStepRegex, StepLines, check_step_regex
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
    metrics = step_lines.parse_seeds("2026-01-24 10:57:31 [rank0] INFO " + SEEDS)
    assert metrics == {
        "step": 3, tm.LOSS: 0.01, tm.ENTROPY: 6.6, tm.KL: 0.0, tm.REWARD_MEAN: 0.5,
        tm.phase_key("step"): 12.34, tm.phase_key("rollout_generate"): 9.10, tm.phase_key("reward"): 0.01,
        tm.phase_key("advantages"): 0.02, tm.phase_key("shard"): 0.10, tm.phase_key("update"): 3.00,
        tm.VALID_TOKENS_PER_S: 2293.0,
    }


def test_the_bundled_trainers_human_line_is_a_seeds_line():
    values = {tm.STEP: 7, tm.LOSS: 0.5, tm.ENTROPY: 1.5, tm.KL: None, tm.REWARD_MEAN: 0.25,
              tm.VALID_TOKENS_PER_S: 100.0, **{tm.phase_key(p): 0.5 for p in tm.PHASES}}
    metrics = step_lines.parse_seeds(tm.human_step_line(values))
    assert metrics[tm.KL] is None  # `kl=null`
    assert {k: metrics[k] for k in values if k != tm.KL} == {k: v for k, v in values.items() if k != tm.KL}


@pytest.mark.parametrize(
    "line", ["step=3", "resuming at step=3 of 10", "global_step=3 loss=1", "nostep=1 x=2"]
)
def test_not_a_seeds_line(line):
    assert step_lines.parse_seeds(line) is None


def test_maxtext_lines_with_and_without_a_logger_prefix():
    assert step_lines.parse_maxtext(MAXTEXT) == {
        "step": 9, tm.phase_key("step"): 0.397, "perf/per_device_tflops_per_sec": 231.178,
        "perf/per_device_tokens_per_sec": 20628.591, "total_weights": 65536.0, tm.LOSS: 10.191,
        "lm_loss": 10.191, "perplexity": 26620.0,
    }
    assert step_lines.parse_maxtext(MAXTEXT_OLD) == {
        "step": 4, tm.phase_key("step"): 1.25, "perf/per_device_tflops_per_sec": 98.5, tm.LOSS: 7.125
    }
    assert step_lines.parse_maxtext("Started training. completed steps: none") is None


def test_json_lines_with_a_step_key():
    line = 'metrics | {"step": 12, "loss": 0.5, "step_time_s": 2.0, "rollout_s": 1.5, "lr": 1e-5, ' \
           '"samples_per_s": 64, "name": "x", "time/train/update_s": 0.25, "bad": NaN}'
    assert step_lines.parse_jsonl(line) == {
        "step": 12, tm.LOSS: 0.5, tm.phase_key("step"): 2.0, tm.phase_key("rollout"): 1.5, "lr": 1e-5,
        "samples_per_s": 64, tm.phase_key("update"): 0.25, "bad": None,
    }
    assert step_lines.parse_jsonl('{"step": "3", "loss": 1}') is None
    assert step_lines.parse_jsonl('{"step": 1.5}') is None
    assert step_lines.parse_jsonl('{"loss": 1}') is None
    assert step_lines.parse_jsonl('{"t": 1, "kind": "eval", "step": 3}') is None
    assert step_lines.parse_jsonl('{"step": 3, "loss"') is None  # cut short


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
