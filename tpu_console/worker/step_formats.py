"""The step-line formats: what one line of a program's output says about its training step, read whatever
prefix a logger adds (`I0804 08:14:00.000000 1 metric_logger.py:196] ...`, `[rank0]: ...`) and without its
colours (ANSI escapes, removed). Whether a line that reads as a step is one is weighed in step_lines.py.

Formats (`FORMATS`; "auto" reads every built-in one, `BUILT_IN`, first match first):
- seeds:   `step=N loss=... entropy=... reward_mean=... dt=12.34s` and `name=seconds` phase fields
           (`rollout_generate=9.10s`, printed with PRINT_TRAIN_TIME_BREAKDOWN=1), as the bundled trainer does;
- maxtext: `completed step: N, seconds: S, TFLOP/s/device: ..., Tokens/s/device: ..., loss: ...`;
- jsonl:   one JSON object per line with an integer `step` key;
- loop:    the lines hand-written loops print: `step 5 | loss 0.123 | 0.21 s/step`, `iter 10: loss 3.21,
           time 120.5ms` (nanoGPT), `Step 100/1000, loss=0.5, lr=1e-4`; a line that speaks of evaluation,
           validation, tests, saving, loading or resuming is not a step;
- tqdm:    a tqdm bar counting steps (`it/s` or `s/it`): a bare one, Hugging Face Trainer's (whose log
           dicts `{'loss': ..., 'epoch': ...}` give the loss of the step the bar shows next, and whose
           `{'train_runtime': ...}` ends training), PyTorch Lightning's `Epoch 0: 50%|...| 5/10 [...,
           train_loss=0.123]` and its Rich bar, `Epoch 0/2 ━━━╸━━━ 5/10 0:00:03 • 0:00:20 3.52it/s v_num: 0
           train_loss: 0.123`, with the rows its metrics wrap onto (Rich redraws live under the job runner's
           TERMINAL_ENV); a bar that starts over after reaching its total continues the count; bars
           described as anything but training (`Validation DataLoader 0`, `Loading checkpoint shards`, `Map`)
           are not steps;
- keras:   Keras's `Epoch 2/3` then `10/10 ━━━━ 0s 5ms/step - loss: 0.1234` (the step is the steps of the
           finished epochs and the bar's count; a bar outside an epoch, `evaluate` or `predict`, is not);
- regex:   a regular expression with named groups given in the job file; a `step` group is required.

Each reader gives a `Reading`: the step and its metrics, with the evidence the line carries (its shape: the
format and the names of what it reports, a bar's description and total; `sure` when it names its own step
time: seeds' `dt=`, MaxText's `seconds:`, a loop's `time 12ms` or `s/step`, Keras's `ms/step`, which nothing
but a step prints).

Values land under the trainer's metric names (trainer/telemetry.py) where they mean the same: a step's time
is `time/train/step_s`, a phase's `time/train/<name>_s`, the seeds' `tokens_per_s` (the trainer's valid
tokens per second) `throughput/train/valid_tokens_per_s`, `reward_mean` `train-reward/total/mean`, a loss
`loss` (Lightning's `train_loss` too); MaxText's per-device figures keep MaxText's own names
(`perf/per_device_tokens_per_sec`): they mean something else.

Python 3.8+ and the standard library only; it imports nothing of the console (it runs on the workers, shipped
beside step_lines.py).
"""

import ast
import json
import re

FORMATS = ("auto", "seeds", "maxtext", "jsonl", "loop", "tqdm", "keras", "regex", "none")
BUILT_IN = ("seeds", "maxtext", "jsonl", "keras", "tqdm", "loop")  # what "auto" reads, first match first
COUNTING = ("tqdm", "keras")  # formats whose step is a count of steps done (a bar), not a line a step
# A bar's rate rounded coarser than this is no step time (Lightning's Rich bar prints two decimals: `0.05it/s`
# is 18 to 22 s a step); the step is then timed by when its lines came
RATE_PRECISION = 0.02

STEP_S = "time/train/step_s"
STEP_AVG_LAST10 = "time/train/step_avg_last10_s"
VALID_TOKENS_PER_S = "throughput/train/valid_tokens_per_s"
REWARD_MEAN = "train-reward/total/mean"
LOSS = "loss"

# Names a program commonly uses for a value the trainer has under another name.
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
# A loop's names for the time of one step (with a unit: `time 120.5ms`, `dt 0.3s`).
LOOP_STEP_TIMES = ("time", "dt", "step_time", "iter_time", "batch_time", "time/step", "time/iter")
# Names a loop's line, a progress bar's postfix or a log dict gives the training loss (`Train step 1
# training loss: 5.53`, tunix).
LOSS_NAMES = ("loss", "train_loss", "training_loss", "train_loss_step", "loss_step")
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|-inf|null|None"
# ECMA-48 escape sequences: CSI (colours, `ESC[1A` cursor up, `ESC[2K` erase line, `ESC[?25l`), OSC up to
# BEL or ST (hyperlinks, window titles), and the two-character ones (`ESC(B`, `ESC7`)
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[ -/]*[0-~])")
_SEEDS_STEP = re.compile(r"(?:^|[\s\]|:,])step=(\d+)\s")
# Names start where a word does (not inside one): a long run of letters is then read once, not once a letter.
_SEEDS_FIELD = re.compile(r"(?<![\w/.-])([A-Za-z_][\w/.-]*)=(" + _NUMBER + r")(s?)(?=[\s,;]|$)")
_MAXTEXT_STEP = re.compile(r"completed step: (\d+)")
_MAXTEXT_VALUE = re.compile(_NUMBER)
_LOOP_STEP = re.compile(r"(?<![\w./-])(step|iter|iteration)(?:\s*[:=#])?\s*(\d+)(?:\s*/\s*(\d+))?(?![\w.])",
                        re.IGNORECASE)
_LOOP_FIELD = re.compile(
    r"(?<![\w/.-])(?:(?P<name>[A-Za-z][\w/.-]*(?: [A-Za-z][\w/.-]*)?)(?:\s*[:=]\s*|\s+))?"
    r"(?P<value>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?P<unit>\s*(?:ms|us|µs|s|%)(?![\w]))?"
    r"(?P<per>\s*/\s*(?:step|it|iter)\b)?(?![\w.])"
)
# Words of a line that is about something else than a training step.
_NOT_A_STEP = re.compile(
    r"(?<![\w-])(eval\w*|validat\w*|val|valid|test\w*|sav(?:e|ed|ing)|load\w*|resum\w*|restor\w*)(?!\w)",
    re.IGNORECASE)
# tqdm's `{desc}: {percent}%|{bar}| {n}/{total} [{elapsed}<{remaining}, {rate}{unit}{postfix}]`
_BAR = re.compile(r"(?<!\d)(\d+)%\|[^|]*\|\s*(\d+)/(\d+)\s*\[[^\]<]*<[^,\]]*,\s*"
                  r"(\d+(?:\.\d+)?|\?)\s?([A-Za-z]+/[A-Za-z]+)(?=[\s,\]])([^\]]*)\]")
_BAR_TRAINING = re.compile(r"(?:epoch|train|step|iter)", re.IGNORECASE)
_POSTFIX_FIELD = re.compile(r"(?<![\w/.-])([A-Za-z_][\w/.-]*)=(" + _NUMBER + r")(?=[\s,]|$)")
# Lightning's Rich bar: `Epoch 0/2 ━━━━╸━━━ 12/100 0:00:03 • 0:00:20 3.52it/s v_num: 0 train_loss: 0.693`
# (`--` for an unknown total, `-:--:--` for a time not known yet); its metrics wrap onto indented rows
_RICH_TIME = r"(?:\d+ days?, )?[\d:]+|-:--:--"
_RICH_BAR = re.compile(r"(?<![━╸╺-])[━╸╺-]+ +(\d+)/(\d+|--) +(?:" + _RICH_TIME + ") • (?:" + _RICH_TIME
                       + r") +(\d+(?:\.\d+)?)it/s(?= |$)(.*)$")
_RICH_FIELD = re.compile(r"(?<![\w/.-])([A-Za-z_][\w/.-]*): (" + _NUMBER + r")(?=\s|$)")
_RICH_WRAPPED = re.compile(r"\s{2,}(?:(?:[A-Za-z_][\w/.-]*:|" + _NUMBER + r")(?:\s+|$))+")
_KERAS_EPOCH = re.compile(r"^\s*Epoch (\d+)/(\d+)\s*$")
_KERAS_BAR = re.compile(r"(?<![\w/])(\d+)/(\d+) +(?:\[[=>.]*\]|[━─]+(?![━─]))\s*(?:-\s*)?(?:\S+\s+)?"
                        r"([\d.]+)(s|ms|us)/step(.*)$")
_KERAS_FIELD = re.compile(r"-\s+([A-Za-z_][\w/.]*):\s+(" + _NUMBER + r")(?=\s|$)")


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


def without_escapes(line):
    """The line without its terminal escape sequences: colours, and the cursor movements and erasures with
    which Rich redraws its live display (each redraw starts with `\\r`, so its rows are lines already)."""
    return _ESCAPE.sub("", line) if "\x1b" in line else line


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


def _with_loss(metrics):
    """`loss` from the first of LOSS_NAMES a bar or a log dict gives, where it gives no `loss` itself."""
    if LOSS not in metrics:
        for name in LOSS_NAMES:
            if metrics.get(name) is not None:
                metrics[LOSS] = metrics[name]
                break
    return metrics


# ---- one line of each format ---------------------------------------------------------------------------


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
    for field in line[found.end():].split(","):
        name, _, value = field.rpartition(": ")
        name, value = name.rsplit(":", 1)[-1].strip(), value.strip()
        if name and _MAXTEXT_VALUE.fullmatch(value):
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


def parse_loop(line):
    """A hand-written loop's step line: `step 5 | loss 0.123 | 0.21 s/step`, `iter 10: loss 3.21, time
    120.5ms`, `Step 100/1000, loss=0.5, lr=1e-4`; None for a line about evaluation, saving, loading or
    resuming, and for a step with no number after it."""
    found = _LOOP_STEP.search(line)
    if found is None or _NOT_A_STEP.search(line):
        return None
    metrics = {"step": int(found.group(2))}
    for field in _LOOP_FIELD.finditer(line, found.end()):
        name, value, per = field.group("name"), field.group("value"), field.group("per")
        unit = (field.group("unit") or "").strip()
        if name is None and not per:
            continue  # a number with no name: nothing to call it
        name = (name or "time/step").replace(" ", "_")
        if name.lower() in ("step", "iter", "iteration"):
            break  # a second step on the same line
        seconds = float(value) * UNITS[unit] if unit in UNITS else None
        if per and seconds is not None or name.lower() in LOOP_STEP_TIMES and seconds is not None:
            metrics[STEP_S] = seconds
        elif seconds is not None:
            metrics[f"time/train/{name}_s"] = seconds
        else:
            metrics[_renamed(name)] = _number(value)
    return _with_loss(metrics) if len(metrics) > 1 else None


def parse_log_dict(line):
    """A Python dict or JSON object a trainer logs without a step (Hugging Face's `{'loss': 0.69, ...,
    'epoch': 0.5}`, its numbers sometimes quoted): ("metrics", {...}); ("end", {...}) for its
    `{'train_runtime': ...}` summary; None for anything else."""
    start = line.find("{")
    end = line.rfind("}")
    if start < 0 or end < start or "epoch" not in line or end - start > 65536:
        return None
    try:
        data = ast.literal_eval(line[start:end + 1])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(data, dict) or "epoch" not in data or "step" in data:
        return None
    metrics = {}
    for name, value in data.items():
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                continue
        if isinstance(name, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
            metrics[_renamed(name)] = value if value == value and abs(value) != float("inf") else None
    if not metrics:
        return None
    return ("end" if "train_runtime" in data else "metrics"), _with_loss(metrics)


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


# ---- readings: what one line says, with what evidence ---------------------------------------------------


class Reading:
    """What a line says. A step: `step`, its `metrics`, its `shape` (lines of one kind share it; `fields`
    are the names that kind reports), `sure` when the line alone is evidence (it names its own step
    time), `counts` for a bar's count of steps done (the newest step stays open), `unfinished` for a bar
    short of its total, `empty` for one that has counted nothing yet this round (support, but no step). Or
    metrics for the step under way (`step` None), or the end of training (`end`)."""

    __slots__ = ("format", "step", "metrics", "shape", "fields", "sure", "counts", "unfinished", "empty",
                 "end")

    def __init__(self, format, step, metrics, shape=None, fields=(), sure=False, counts=False,
                 unfinished=False, empty=False, end=False):
        self.format, self.step, self.metrics, self.shape = format, step, metrics, shape or (format,)
        self.fields, self.sure, self.counts = frozenset(fields), sure, counts
        self.unfinished, self.empty, self.end = unfinished, empty, end


def _line_reader(name, parse, shaped=True):
    """A reader of a format whose lines stand alone: their field names are their shape."""

    def read(line):
        metrics = parse(line)
        if metrics is None:
            return None
        step = metrics.pop("step")
        fields = [n for n in metrics if n != STEP_AVG_LAST10] if shaped else ()
        return Reading(name, step, metrics, fields=fields, sure=metrics.get(STEP_S) is not None)

    return read


class _Bars:
    """Progress bars counting training steps: tqdm's, and Lightning's Rich bar with the rows its metrics wrap
    onto; and the log dicts Hugging Face's Trainer writes between them."""

    def __init__(self):
        self.restart()

    def restart(self):
        self.counted = {}  # a bar's shape: [steps of its earlier rounds, its last count, its description]
        self.wrapping = None  # (the last Rich bar's reading, its metrics' text): the rows after it add to it

    def __call__(self, line):
        wrapping, self.wrapping = self.wrapping, None
        found = _BAR.search(line)
        rich = None if found else _RICH_BAR.search(line)
        if found:
            n, total, rate, unit, postfix = found.group(2, 3, 4, 5, 6)
            if unit not in ("it/s", "s/it"):
                return None  # bytes, examples, batches of a data pipeline: not training steps
        elif rich:
            n, total, rate, postfix = rich.groups()
            unit = "it/s"
        elif wrapping and _RICH_WRAPPED.fullmatch(line):
            return self._wrapped(*wrapping, line)
        else:
            logged = parse_log_dict(line)
            if logged is None:
                return None
            kind, metrics = logged
            return Reading("tqdm", None, metrics, end=kind == "end")
        n, total = int(n), int(total) if total.isdigit() else None  # Rich's `--`: a total not known
        description = line[:(found or rich).start()].strip().rstrip(":").strip()
        if description and (not _BAR_TRAINING.match(description) or _NOT_A_STEP.search(description)):
            return None  # `Validation DataLoader 0`, `Sanity Checking`, `Loading checkpoint shards`
        shape = ("tqdm", re.sub(r"\d+", "#", description), total)
        before, last, drawn_as = self.counted.setdefault(shape, [0, 0, description])
        if n < last:
            if (total is None or last < total) and description == drawn_as:
                return None  # a bar drawn below its own unfinished count: another bar of the same look
            # it starts over, the next epoch: counted on from the last round's total (`Epoch 3` after
            # `Epoch 2` says that round is over, also where its last redraw was not written)
            before += last if total is None else total
            self.counted[shape][0] = before
        self.counted[shape][1:] = [n, description]
        metrics, rate = _bar_fields(_POSTFIX_FIELD if found else _RICH_FIELD, postfix), _rate(rate)
        if rate:
            metrics[STEP_S] = 1.0 / rate if unit == "it/s" else rate
        reading = Reading("tqdm", before + n, _with_loss(metrics), shape=shape, counts=True,
                          unfinished=total is None or n < total, empty=n == 0)
        if rich and n:
            self.wrapping = reading, postfix
        return reading

    def _wrapped(self, bar, text, row):
        """A row that Rich's table wrapped the bar's metrics onto: the bar's step again, with all its metrics
        (a name and its value can fall on two rows)."""
        text += " " + row.strip()
        metrics = _bar_fields(_RICH_FIELD, text)
        if STEP_S in bar.metrics:
            metrics[STEP_S] = bar.metrics[STEP_S]
        reading = Reading("tqdm", bar.step, _with_loss(metrics), shape=bar.shape, counts=True,
                          unfinished=bar.unfinished)
        self.wrapping = reading, text
        return reading


def _bar_fields(pattern, text):
    """The metrics a bar shows after its count (Lightning's `v_num`, the logger's version, is none)."""
    return {_renamed(name): _number(value) for name, value in pattern.findall(text) if name != "v_num"}


def _rate(text):
    """A bar's rate as drawn; None where it is not known (`?`, 0) or too rounded to time a step
    (RATE_PRECISION)."""
    if text == "?" or float(text) <= 0:
        return None
    decimals = len(text.partition(".")[2])
    return float(text) if 0.5 * 10 ** -decimals <= RATE_PRECISION * float(text) else None


class _Keras:
    """Keras's `Epoch e/E` lines and the progress bar under each."""

    def __init__(self):
        self.restart()

    def restart(self):
        self.in_epoch = False
        self.before = 0  # steps of the finished epochs
        self.last = 0  # the bar's count in this epoch

    def __call__(self, line):
        if _KERAS_EPOCH.match(line):
            if self.in_epoch:
                self.before += self.last
            self.in_epoch, self.last = True, 0
            return None
        found = _KERAS_BAR.search(line)
        if found is None:
            return None
        n, total = int(found.group(1)), int(found.group(2))
        if not self.in_epoch or n < self.last:
            self.in_epoch = False  # a bar outside fit's epochs: evaluate, predict
            return None
        self.last = n
        metrics = {STEP_S: float(found.group(3)) * UNITS[found.group(4)]}
        for name, value in _KERAS_FIELD.findall(found.group(5)):
            metrics[_renamed(name)] = _number(value)
        return Reading("keras", self.before + n, metrics, sure=True, counts=True, unfinished=n < total)


def readers(format, regex):
    """The readers of `format` (one of FORMATS; "auto": every built-in one, in the order they are tried)."""
    if format == "regex":
        if not regex:
            raise ValueError("the metrics format is regex but no regex is given")
        return [_line_reader("regex", RegexParser(regex), shaped=False)]
    readers = {
        "seeds": lambda: _line_reader("seeds", parse_seeds),
        "maxtext": lambda: _line_reader("maxtext", parse_maxtext, shaped=False),
        "jsonl": lambda: _line_reader("jsonl", parse_jsonl),
        "loop": lambda: _line_reader("loop", parse_loop),
        "tqdm": _Bars,
        "keras": _Keras,
    }
    names = BUILT_IN if format == "auto" else () if format == "none" else (format,)
    return [readers[name]() for name in names]
