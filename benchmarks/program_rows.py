r"""What a corpus program made, what the console saw of it, and the verdict: the pure half of
benchmarks/programs.py (no pod, no processes), so its rules are tested on their own
(tests/benchmarks/test_program_rows.py).

Each program's folder, benchmarks/programs/<name>/, holds program.toml:

    command = ["python", "train.py"]         # argv, run in the project folder on every worker
    python = "3.12"                          # optional: the Python its setup needs (setup --python-version)
    truth = '(?m)^step (?P<step>\d+) \|'     # its own step lines: a named group `step`
    step_time = '\| (?P<s>[\d.]+) s/step'    # optional: its own step time: a group `s`, `ms`, `us`, `per_s`
    loss = '\| loss (?P<loss>[\d.]+)'        # optional: its own loss, a named group `loss`
    steps = 30                               # optional, where it has no `truth`: its steps, counted 1..N
    package = "jax"                          # optional: whose version names it (else requirements.txt's)
    about = "..."

On each worker, from the program's own output (output.log):
- steps made: `truth`'s matches, in order; a match that repeats the step just before it (a progress bar
  redrawn with \r) is the same step. Without `truth`, program.toml's `steps` N, the last of them N (a bar
  such as tqdm's counts 1..N, but draws only some of them);
- its step time: the median of what `step_time` matches (`per_s`: steps a second, as tqdm's `it/s`), one a
  step where `truth` tells the steps (the first from a step's line to the next step's: a redraw weighs
  once); where it prints none, the median time per step between its consecutive step lines by the times
  those lines give themselves, where they give one (absl's `I1127 21:44:59.518823 ...`, Python logging's
  asctime, ISO 8601: tpu_console/worker/log_timestamps.py), else the median of its rate at each step line
  (since the line ten steps back, or 0.25 s: as the console has it, but by when the lines reached the
  file, looked at every 5 ms here);
- its loss: the last value `loss` matches.
From the console: its step events (events.jsonl, as the run's archive keeps it), the last step `status`
shows, the median of its events' step times, the loss of its last step.

The targets, on every worker: steps seen = steps made, exactly: `status` at the last step made, and, where
`truth` tells each step, one step event a step; no spurious step: none the program did not make (with
`steps` only: none past N, none that does not rise), none seen twice; the step time seen within 10% of the
program's own; the loss seen at the last step equal to the program's last, wherever it prints one.
And the app's run dashboard (benchmarks/dashboard_view.py: its Steps and Plots tabs, read from the real
app) holds the same steps as the step events, at the same last step, step time and loss; its step-time
plot is drawn wherever there are two steps, and its third plot is the loss wherever the program prints one.
"""

from __future__ import annotations

import bisect
import json
import math
import re
import statistics
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpu_console.worker.log_timestamps import timestamp
from tpu_console.worker.step_lines import StepLines

STEP_TIME_TOLERANCE = 0.10
STEP_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}  # seconds per unit; `per_s` is steps a second
LOSS_TOLERANCE = 1e-3  # relative: the console reads the very text the program printed
KEYS = {"command", "python", "truth", "step_time", "loss", "steps", "package", "about"}
STEP_S = "time/train/step_s"  # the step events' step time (trainer/telemetry.py's name)


class BadProgram(ValueError):
    """A program.toml that cannot be used: the message names the file, the problem and the fix."""


@dataclass(frozen=True)
class Program:
    name: str
    folder: Path
    command: list[str]
    python: str | None = None
    truth: re.Pattern[str] | None = None
    step_time: re.Pattern[str] | None = None
    loss: re.Pattern[str] | None = None
    steps: int | None = None
    package: str | None = None
    about: str = ""


def _pattern(path: Path, key: str, text: object, groups: Sequence[str]) -> re.Pattern[str]:
    if not isinstance(text, str):
        raise BadProgram(f"{path}: `{key}` must be a string (a regular expression)")
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise BadProgram(f"{path}: `{key}` {text!r} does not compile ({exc})") from None
    if not set(groups) & set(pattern.groupindex):
        named = " or ".join(f"`(?P<{g}>...)`" for g in groups)
        raise BadProgram(f"{path}: `{key}` {text!r} has no named group {named}; add one")
    return pattern


def load_program(folder: Path) -> Program:
    """The program of a folder, from its program.toml; BadProgram where the file cannot be used."""
    path = folder / "program.toml"
    try:
        spec = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BadProgram(f"{path}: cannot be read as TOML ({exc})") from None
    unknown = sorted(set(spec) - KEYS)
    if unknown:
        raise BadProgram(f"{path}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(KEYS))}")
    command = spec.get("command")
    if not (isinstance(command, list) and command and all(isinstance(a, str) for a in command)):
        raise BadProgram(f'{path}: `command` must be a list of strings, e.g. ["python", "train.py"]')
    steps = spec.get("steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 0):
        raise BadProgram(f"{path}: `steps` must be a whole number of steps")
    if "truth" not in spec and steps is None:
        raise BadProgram(f"{path}: neither `truth` nor `steps`: say how the steps the program makes are "
                         "counted")
    python = spec.get("python")
    if python is not None and not re.fullmatch(r"3\.\d+", str(python)):
        raise BadProgram(f'{path}: `python` must be a version such as "3.12"')
    return Program(
        name=folder.name,
        folder=folder,
        command=command,
        python=python,
        truth=_pattern(path, "truth", spec["truth"], ["step"]) if "truth" in spec else None,
        step_time=(_pattern(path, "step_time", spec["step_time"], [*STEP_TIME_UNITS, "per_s"])
                   if "step_time" in spec else None),
        loss=_pattern(path, "loss", spec["loss"], ["loss"]) if "loss" in spec else None,
        steps=steps,
        package=spec.get("package"),
        about=spec.get("about", ""),
    )


def first_requirement(folder: Path) -> str | None:
    """The distribution a requirements.txt names first (its version names the program where program.toml
    names no `package`)."""
    try:
        lines = (folder / "requirements.txt").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
            if found:
                return found.group(0)
    return None


# --- what the program made ---------------------------------------------------------------------------

def made_steps(text: str, truth: re.Pattern[str]) -> list[tuple[int, int]]:
    """(step, offset in text) of each step truth matches, in order; a match of the step just before it is
    a redraw of the same line, not another step."""
    steps: list[tuple[int, int]] = []
    for found in truth.finditer(text):
        step = int(found.group("step"))
        if steps and steps[-1][0] == step:
            continue
        steps.append((step, found.start()))
    return steps


def printed_step_times(
    text: str, step_time: re.Pattern[str], steps: Sequence[tuple[int, int]] | None = None
) -> list[float]:
    """The step times the program printed, in seconds, whichever unit group matched: every one, or with
    `steps` (truth's, made_steps) one a step, the first printed from its step's line on (before the next
    step's), so that a bar redrawn for the same step (tqdm's postfix, its close with the run's average)
    weighs once, as the step is counted once."""
    times: list[tuple[int, float]] = []  # (offset, seconds)
    for found in step_time.finditer(text):
        groups = found.groupdict()
        if groups.get("per_s") is not None and float(groups["per_s"]) > 0:
            times.append((found.start(), 1 / float(groups["per_s"])))
            continue
        unit = next((u for u in STEP_TIME_UNITS if groups.get(u) is not None), None)
        if unit is not None:
            times.append((found.start(), float(groups[unit]) * STEP_TIME_UNITS[unit]))
    if steps is None:
        return [seconds for _, seconds in times]
    starts = [at for _, at in steps]
    each_step: dict[int, float] = {}
    for at, seconds in times:
        index = bisect.bisect_right(starts, at) - 1
        if index >= 0:
            each_step.setdefault(index, seconds)
    return list(each_step.values())


def arrival(growth: Sequence[tuple[float, int]], offset: int) -> float | None:
    """When the byte at offset reached the file: growth is (seconds, file size) at each time it grew."""
    return next((t for t, size in growth if size > offset), None)


def measured_step_s(steps: Sequence[tuple[int, int]], growth: Sequence[tuple[float, int]]) -> float | None:
    """Wall time per step from when the first and the last step lines reached the file; None with fewer
    than two steps, no times, or lines that arrived together (the output was buffered: no time between
    them to measure)."""
    if len(steps) < 2:
        return None
    (first, first_at), (last, last_at) = steps[0], steps[-1]
    start, end = arrival(growth, first_at), arrival(growth, last_at)
    if start is None or end is None or last <= first or end <= start:
        return None
    return (end - start) / (last - first)


def arrived_step_s(steps: Sequence[tuple[int, int]], growth: Sequence[tuple[float, int]]) -> float | None:
    """The median of its rate at each step line by the console's own rule (worker/step_lines.py: since the
    line ten steps back, or further until 0.25 s), applied to when the lines reached the file as looked at
    every 5 ms here, where the console reads every 20 ms on a worker that also runs the program; None with
    no two looks that brought step lines."""
    parser = StepLines("regex", r"(?P<step>\d+)")
    rates = []
    for step, at in steps:
        when = arrival(growth, at)
        if when is not None:
            rates += [e[STEP_S] for e in parser.feed(str(step), now=when) if e.get(STEP_S) is not None]
    return statistics.median(rates) if rates else None


def stamped_step_s(text: str, steps: Sequence[tuple[int, int]]) -> float | None:
    """The median time per step between consecutive step lines, by the times the lines give themselves
    (each step's own figure, as a printed step time is); None where no two consecutive lines both give one
    (or give rising times)."""
    times = [(step, timestamp(line_at(text, at))) for step, at in steps]
    gaps = [(end - start) / (step - before)
            for (before, start), (step, end) in zip(times[:-1], times[1:], strict=True)
            if start is not None and end is not None and end > start and step > before]
    return statistics.median(gaps) if gaps else None


def line_at(text: str, offset: int) -> str:
    """The line the character at offset is in (a line ends at \n or \r)."""
    start = max(text.rfind("\n", 0, offset), text.rfind("\r", 0, offset)) + 1
    return text[start:]  # what follows its end is no matter: a time is read at a line's start


def parse_number(text: str) -> float:
    return float(text) if text.lower() not in ("nan", "-nan") else math.nan


@dataclass
class Made:
    """One worker's run as the program tells it."""

    steps: list[int] | None  # the step numbers truth matched; None without truth
    count: int
    last: int | None  # the last step made: truth's last, else program.toml's `steps`
    step_s: float | None
    step_s_measured: bool  # the program printed no step time: it was measured here
    step_s_stamped: bool  # measured by the times its step lines give themselves
    wall_step_s: float | None  # from when its first and last step lines reached the file (a check)
    losses: list[float]  # every loss it printed (NaN where it printed one)
    no_step_s: str | None = None  # why step_s is None


def made(program: Program, text: str, growth: Sequence[tuple[float, int]]) -> Made:
    steps = made_steps(text, program.truth) if program.truth is not None else None
    printed = printed_step_times(text, program.step_time, steps) if program.step_time is not None else []
    untimed = steps is not None and not printed  # its step time is measured here
    stamped = stamped_step_s(text, steps) if untimed else None
    wall = measured_step_s(steps, growth) if steps is not None else None
    arrived = arrived_step_s(steps, growth) if untimed and stamped is None else None
    measured = stamped if stamped is not None else arrived
    losses = [parse_number(m.group("loss")) for m in program.loss.finditer(text)] if program.loss else []
    if printed or measured is not None:
        no_step_s = None
    elif steps is None:
        no_step_s = ("its step_time matched nothing in its output" if program.step_time is not None
                     else "program.toml has no step_time, and no truth to time its steps by")
    elif len(steps) < 2:
        no_step_s = "it prints no step time, and fewer than two steps to time"
    else:
        no_step_s = "it prints no step time, and its step lines reached output.log all at once"
    return Made(
        steps=[s for s, _ in steps] if steps is not None else None,
        count=len(steps) if steps is not None else program.steps or 0,
        last=(steps[-1][0] if steps else None) if steps is not None else program.steps,
        step_s=statistics.median(printed) if printed else measured,
        step_s_measured=not printed and measured is not None,
        step_s_stamped=not printed and stamped is not None,
        wall_step_s=wall,
        losses=losses,
        no_step_s=no_step_s,
    )


# --- what the console saw ----------------------------------------------------------------------------

@dataclass
class Seen:
    """One worker's run as the console shows it."""

    steps: list[int]  # every step event, in order
    last: int | None  # the step `status --json` shows
    step_s: float | None  # the median of the step events' step times
    loss: float | None  # the loss `status --json` shows at its last step
    losses: int  # step events with a loss
    formats: list[str] = field(default_factory=list)  # the formats the step events name, in order seen


def step_events(events_text: str) -> list[dict]:
    """The step events of an events.jsonl; a line that is not JSON is skipped (a torn last line)."""
    events = []
    for line in events_text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("kind") == "step":
            events.append(event)
    return events


def seen(events_text: str, status_worker: dict | None) -> Seen:
    events = step_events(events_text)
    times = [e[STEP_S] for e in events if isinstance(e.get(STEP_S), int | float)]
    last = (status_worker or {}).get("last_step") or {}
    formats: list[str] = []
    for event in events:
        if isinstance(event.get("format"), str) and event["format"] not in formats:
            formats.append(event["format"])
    return Seen(
        steps=[int(e.get("step", 0) or 0) for e in events],
        last=last.get("step"),
        step_s=statistics.median(times) if times else None,
        loss=last.get("loss"),
        losses=sum(isinstance(e.get("loss"), int | float) for e in events),
        formats=formats,
    )


# --- the verdict -------------------------------------------------------------------------------------

def relative_error(seen_value: float, own: float) -> float:
    """|seen / own - 1|; a program that printed 0 (its step time rounded away) agrees only with 0."""
    if own == 0:
        return 0.0 if seen_value == 0 else math.inf
    return abs(seen_value / own - 1)


def judge(program_made: Made, console_seen: Seen) -> list[str]:
    """What misses a target on one worker, one phrase each; none: it passes."""
    m, s = program_made, console_seen
    problems = []
    if m.last is not None and s.last != m.last:
        shown = s.last if s.last is not None else "-"
        problems.append(f"status shows step {shown}, the last made is {m.last}")
    if m.steps is not None:
        if len(s.steps) != m.count:
            problems.append(f"{len(s.steps)} step(s) seen, {m.count} made")
        spurious = sorted((Counter(s.steps) - Counter(m.steps)).elements())
    else:  # a bar draws some of its steps: any it shows is one made, if it rises and stays within N
        spurious = [step for i, step in enumerate(s.steps)
                    if step > m.count or (i > 0 and step <= s.steps[i - 1])]
    if spurious:
        shown = ", ".join(str(step) for step in spurious[:5]) + (", ..." if len(spurious) > 5 else "")
        problems.append(f"{len(spurious)} spurious step(s) seen ({shown})")
    if m.count > 0:
        if m.step_s is None:
            problems.append(f"no step time of the program's own to compare with: {m.no_step_s}")
        elif s.step_s is None:
            problems.append("no step time seen")
        elif (off := relative_error(s.step_s, m.step_s)) > STEP_TIME_TOLERANCE:
            problems.append(f"step time seen {s.step_s:.4g} s is {off:.0%} off the program's "
                            f"{m.step_s:.4g} s")
    if m.losses:
        own = m.losses[-1]
        if math.isnan(own):
            if s.loss is not None and not math.isnan(s.loss):
                problems.append(f"loss seen {s.loss:.6g} where the program's last is nan")
        elif s.loss is None:
            problems.append(f"no loss seen (the program's last: {own:.6g})")
        elif relative_error(s.loss, own) > LOSS_TOLERANCE:
            problems.append(f"loss seen {s.loss:.6g} != the program's last {own:.6g}")
    return problems


@dataclass
class Shown:
    """One worker as the app's run dashboard holds it (benchmarks/dashboard_view.py): what its Steps tab
    and its plots are drawn from."""

    steps: int
    last: int | None
    step_s: float | None  # the median of its steps' step times
    loss: float | None  # at its last step


def dashboard_shown(document: dict) -> dict[int, Shown]:
    """Each worker's `Shown` from dashboard_view.py's JSON (a worker with no step is absent there)."""
    return {int(w): Shown(v["steps"], v["last"], v["step_s"], v["loss"])
            for w, v in (document.get("workers") or {}).items()}


def judge_dashboard(console_seen: Seen, shown: Shown | None) -> list[str]:
    """What the dashboard shows of one worker against what the console's step events and `status` say
    (the dashboard is a third reader of the same steps: it must agree with them, not only be close)."""
    s = console_seen
    if shown is None:
        return ["the dashboard holds no step"] if s.steps else []
    problems = []
    if shown.steps != len(set(s.steps)):
        problems.append(f"the dashboard holds {shown.steps} step(s), the console saw {len(set(s.steps))}")
    if shown.last != s.last:
        problems.append(f"the dashboard's last step is {shown.last}, status shows {s.last}")
    for name, value, reference in (("step time", shown.step_s, s.step_s), ("loss", shown.loss, s.loss)):
        if (value is None) != (reference is None) or (
                value is not None and relative_error(value, reference) > LOSS_TOLERANCE):
            problems.append(f"the dashboard's {name} is {_number(value)}, the console's {_number(reference)}")
    return problems


def judge_plots(document: dict, steps_seen: int, prints_loss: bool) -> list[str]:
    """The Plots tab: a step-time line wherever there are two steps, the loss as its third plot wherever
    the program prints one."""
    plots = document.get("plots") or {}
    problems = []
    if steps_seen >= 2 and not plots.get("plot-step-time", {}).get("drawn"):
        problems.append("the Plots tab draws no step time: "
                        f"{plots.get('plot-step-time', {}).get('note') or 'no plot'}")
    if prints_loss:
        third = plots.get("plot-reward", {})
        if not third.get("drawn") or "loss" not in (document.get("plot_titles") or []):
            why = third.get("note") or "its third plot is not the loss"
            problems.append(f"the Plots tab draws no loss: {why}")
    return problems


@dataclass
class WorkerResult:
    made: Made
    seen: Seen
    problems: list[str]
    shown: Shown | None = None  # the app's dashboard; None: it holds no step of this worker


@dataclass
class Row:
    """One program's run on the pod."""

    program: str
    version: str = "-"
    workers: dict[int, WorkerResult] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # the run's own: setup failed, the program failed
    format: str = "-"  # the formats the console found (else what `runs show` says of its steps)
    goodput_pct: float | None = None
    phases_s: dict[str, float] = field(default_factory=dict)  # sync, setup, run: wall seconds
    run_id: str | None = None

    @property
    def passed(self) -> bool:
        return not self.all_problems()

    def all_problems(self) -> list[str]:
        if not self.workers and not self.problems:
            return ["nothing was run"]
        by_worker = [f"worker {w}: {p}" for w, r in sorted(self.workers.items()) for p in r.problems]
        return self.problems + by_worker

    def to_json(self) -> dict:
        return {
            "program": self.program, "version": self.version, "run_id": self.run_id, "passed": self.passed,
            "problems": self.all_problems(), "format": self.format, "goodput_pct": self.goodput_pct,
            "phases_s": self.phases_s,
            "workers": {str(w): asdict(r) for w, r in sorted(self.workers.items())},
        }


# --- the table ---------------------------------------------------------------------------------------

COLUMNS = ("PROGRAM", "VERSION", "MADE", "LAST", "SEEN", "SHOWN", "DASH", "OWN_S", "SEEN_S", "LOSS",
           "LOSS_SEEN", "FORMAT", "GOODPUT", "SYNC", "SETUP", "RUN", "VERDICT")


def _each(row: Row, value) -> str:
    """A figure of every worker: one value where they agree, else each worker's, `/` between."""
    texts = [value(r) for _, r in sorted(row.workers.items())]
    if not texts:
        return "-"
    return texts[0] if len(set(texts)) == 1 else "/".join(texts)


def _number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    return "nan" if math.isnan(value) else f"{value:.{digits}g}"


def cells(row: Row) -> list[str]:
    def own_s(r: WorkerResult) -> str:
        mark = "" if not r.made.step_s_measured else "@" if r.made.step_s_stamped else "~"
        return mark + _number(r.made.step_s)

    def phase(name: str) -> str:
        return f"{row.phases_s[name]:.0f}s" if name in row.phases_s else "-"

    return [
        row.program,
        row.version,
        _each(row, lambda r: str(r.made.count)),
        _each(row, lambda r: "-" if r.made.last is None else str(r.made.last)),
        _each(row, lambda r: str(len(r.seen.steps))),
        _each(row, lambda r: "-" if r.seen.last is None else str(r.seen.last)),
        _each(row, lambda r: "-" if r.shown is None or r.shown.last is None else str(r.shown.last)),
        _each(row, own_s),
        _each(row, lambda r: _number(r.seen.step_s)),
        _each(row, lambda r: _number(r.made.losses[-1]) if r.made.losses else "-"),
        _each(row, lambda r: _number(r.seen.loss)),
        row.format,
        "-" if row.goodput_pct is None else f"{row.goodput_pct:.1f}%",
        phase("sync"),
        phase("setup"),
        phase("run"),
        "PASS" if row.passed else "FAIL",
    ]


def table(rows: Sequence[Row]) -> str:
    """The rows as a table, then each failing row's reasons, then what the columns mean."""
    grid = [list(COLUMNS), *(cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in grid) for i in range(len(COLUMNS))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True)).rstrip()
             for line in grid]
    failing = [(r.program, p) for r in rows if not r.passed for p in r.all_problems()]
    if failing:
        lines.append("")
        lines.extend(f"{name}: {problem}" for name, problem in failing)
    lines.append("")
    lines.append("MADE, LAST: the steps the program made and its last (its own output, or program.toml's "
                 "`steps`); SEEN: the console's step events; SHOWN: the step `status` shows; DASH: the last "
                 "step the app's run dashboard holds; OWN_S, SEEN_S: "
                 "median step time, the program's (@: measured by its step lines' own times, ~: by when they "
                 "arrived) and the "
                 "console's; LOSS, LOSS_SEEN: the program's last and the console's at its last step; a/b: "
                 "worker 0's and 1's where they differ; SYNC, SETUP, RUN: wall time of sync --dir, setup, "
                 "launch to the run's end")
    return "\n".join(lines)
