"""Step lines in any program's output: what a job that knows nothing of tpu-console says about its progress.

The job runner (job_runner.py) reads a command job's `output.log` as it grows and turns each line this
module recognises into a step event of `events.jsonl`, the file the trainer writes itself, so every view of
the console (status, the dashboard's Steps and Plots tabs, history, compare, the supervisor's stall check)
reads a foreign program as it reads the trainer. A line is recognised wherever it sits in the line: loggers
add prefixes (`I0804 08:14:00.000000 1 metric_logger.py:196] ...`, `[rank0]: ...`).

Formats (`FORMATS`; "auto" tries the built-in ones and keeps the first that matches):
- seeds:   `step=N loss=... entropy=... reward_mean=... dt=12.34s` and `name=seconds` phase fields
           (`rollout_generate=9.10s`, printed with PRINT_TRAIN_TIME_BREAKDOWN=1), as the bundled trainer does;
- maxtext: `completed step: N, seconds: S, TFLOP/s/device: ..., Tokens/s/device: ..., loss: ...`;
- jsonl:   one JSON object per line with an integer `step` key;
- regex:   a regular expression with named groups given in the job file; a `step` group is required.

Values land under the trainer's metric names (trainer/telemetry.py) where they mean the same: a step's time
is `time/train/step_s`, a phase's `time/train/<name>_s`, the seeds' `tokens_per_s` (the trainer's valid
tokens per second) `throughput/train/valid_tokens_per_s`, `reward_mean` `train-reward/total/mean`; MaxText's
per-device figures keep MaxText's own names (`perf/per_device_tokens_per_sec`): they mean something else.
Every event also gets `time/train/step_avg_last10_s` over the step times seen so far, as the trainer does.

Python 3.8+ and the standard library only; it imports nothing of the console (it runs on the workers).
"""

import json
import re
import time
from collections import deque

FORMATS = ("auto", "seeds", "maxtext", "jsonl", "regex", "none")
BUILT_IN = ("seeds", "maxtext", "jsonl")  # what "auto" tries, in this order
SOURCE = "output.log"  # the `source` of the step events made here

STEP_S = "time/train/step_s"
STEP_AVG_LAST10 = "time/train/step_avg_last10_s"
VALID_TOKENS_PER_S = "throughput/train/valid_tokens_per_s"
REWARD_MEAN = "train-reward/total/mean"

# Names a program commonly uses for a value the trainer has under another name (seeds, jsonl and regex).
ALIASES = {
    "dt": STEP_S,
    "step_s": STEP_S,
    "step_time": STEP_S,
    "step_time_s": STEP_S,
    "seconds": STEP_S,
    "reward_mean": REWARD_MEAN,
    "tokens_per_s": VALID_TOKENS_PER_S,
    "valid_tokens_per_s": VALID_TOKENS_PER_S,
}
MAXTEXT_NAMES = {
    "seconds": STEP_S,
    "TFLOP/s/device": "perf/per_device_tflops_per_sec",
    "TFLOP/s": "perf/per_device_tflops_per_sec",
    "Tokens/s/device": "perf/per_device_tokens_per_sec",
}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|-inf|null|None"
_SEEDS_STEP = re.compile(r"(?:^|[\s\]|:,])step=(\d+)\s")
_SEEDS_FIELD = re.compile(r"([A-Za-z_][\w/.-]*)=(" + _NUMBER + r")(s?)(?=[\s,;]|$)")
_MAXTEXT_STEP = re.compile(r"completed step: (\d+)")
_MAXTEXT_FIELD = re.compile(r"([^,:]+?): (" + _NUMBER + r")\s*(?:,|$)")


class BadStepRegex(ValueError):
    """A job file's step regex that cannot be used: the message names the problem and the fix."""


def check_step_regex(pattern):
    """The compiled pattern, or BadStepRegex: it must compile and have a named group `step`."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise BadStepRegex(f"the metrics regex {pattern!r} does not compile ({exc}); fix it in the job "
                           "file's [metrics] regex") from None
    if "step" not in compiled.groupindex:
        raise BadStepRegex(f"the metrics regex {pattern!r} has no named group `step`; write one, e.g. "
                           r"'step (?P<step>\d+) loss (?P<loss>[\d.]+)'")
    return compiled


def _number(text):
    if text in ("null", "None"):
        return None
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        return None  # events.jsonl holds no NaN (the trainer writes null)
    return value


def _renamed(name, suffix_s=False):
    """A program's metric name as the trainer calls the same thing."""
    if name in ALIASES:
        return ALIASES[name]
    if suffix_s or (name.endswith("_s") and "/" not in name and not name.endswith("per_s")):
        base = name[:-2] if name.endswith("_s") else name
        return f"time/train/{base}_s"  # a phase's seconds
    return name


def parse_seeds(line):
    found = _SEEDS_STEP.search(line)
    if found is None:
        return None
    metrics = {"step": int(found.group(1))}
    for name, value, seconds in _SEEDS_FIELD.findall(line[found.end() - 1:]):
        if name == "step":
            break  # a second step line on the same line
        metrics[_renamed(name, seconds == "s")] = _number(value)
    return metrics if len(metrics) > 1 else None  # `step=3` alone is not a step line


def parse_maxtext(line):
    found = _MAXTEXT_STEP.search(line)
    if found is None:
        return None
    metrics = {"step": int(found.group(1))}
    rest = line[found.end():].lstrip(", ")
    for name, value in _MAXTEXT_FIELD.findall(rest):
        name = name.strip()
        metrics[MAXTEXT_NAMES.get(name, name)] = _number(value)
    return metrics


_DECODER = json.JSONDecoder()


def parse_jsonl(line):
    start = line.find("{")
    if start < 0 or '"step"' not in line:
        return None
    try:
        data, _ = _DECODER.raw_decode(line, start)
    except ValueError:
        return None
    step = data.get("step") if isinstance(data, dict) else None
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step != int(step):
        return None
    if data.get("kind") not in (None, "step"):
        return None  # another kind of event (the trainer's own events.jsonl lines, echoed)
    metrics = {"step": int(step)}
    for name, value in data.items():
        if name in ("step", "kind", "t", "process"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # text, lists: not a metric to plot
        metrics[_renamed(name)] = value if value == value and abs(value) != float("inf") else None
    return metrics


class RegexParser:
    def __init__(self, pattern):
        self.pattern = check_step_regex(pattern)

    def __call__(self, line):
        found = self.pattern.search(line)
        if found is None:
            return None
        try:
            metrics = {"step": int(found.group("step"))}
        except (TypeError, ValueError):
            return None
        for name, value in found.groupdict().items():
            if name == "step" or value is None:
                continue
            try:
                metrics[_renamed(name)] = _number(value)
            except ValueError:
                continue
        return metrics


PARSERS = {"seeds": parse_seeds, "maxtext": parse_maxtext, "jsonl": parse_jsonl}


class StepLines:
    """Turns a job's output lines into step events. `format`: one of FORMATS; `regex` for "regex".
    `format_found` is the format the lines matched (for "auto", the first built-in one that did)."""

    def __init__(self, format="auto", regex=None, process=0):
        if format not in FORMATS:
            raise ValueError(f"unknown metrics format {format!r}; use one of {', '.join(FORMATS)}")
        self.format = format
        self.process = process
        self.format_found = None
        self.lines_read = 0
        self.steps_found = 0
        self._recent = deque(maxlen=10)
        if format == "regex":
            if not regex:
                raise ValueError("the metrics format is regex but no regex is given")
            self._parsers = [("regex", RegexParser(regex))]
        elif format == "auto":
            self._parsers = [(name, PARSERS[name]) for name in BUILT_IN]
        elif format == "none":
            self._parsers = []
        else:
            self._parsers = [(format, PARSERS[format])]

    def parse(self, line):
        """(format, metrics) of one line, or None when it is no step line."""
        for name, parser in self._parsers:
            metrics = parser(line)
            if metrics is not None:
                if self.format == "auto":
                    self._parsers = [(name, parser)]  # a program keeps to one format
                self.format_found = name
                return name, metrics
        return None

    def event(self, line, now=None):
        """The step event for one line of output, or None."""
        self.lines_read += 1
        parsed = self.parse(line)
        if parsed is None:
            return None
        name, metrics = parsed
        self.steps_found += 1
        event = {"t": time.time() if now is None else now, "kind": "step", "process": self.process,
                 "source": SOURCE, "format": name}
        event.update(metrics)
        step_s = metrics.get(STEP_S)
        if isinstance(step_s, (int, float)):
            self._recent.append(step_s)
        if self._recent and STEP_AVG_LAST10 not in metrics:
            event[STEP_AVG_LAST10] = sum(self._recent) / len(self._recent)
        return event
