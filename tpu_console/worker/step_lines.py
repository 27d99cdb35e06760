"""Step lines in any program's output: what a job that knows nothing of tpu-console says about its progress.

The job runner (job_runner.py) reads a command job's `output.log` as it grows, splits it with
`complete_lines` (a line ends at `\\n`, at `\\r` and at a run of `\\b`: progress bars redraw themselves with
those, and each redrawn state is a line) and turns the steps this module recognises into step events of
`events.jsonl`, the file the trainer writes itself, so every view of the console (status, the dashboard's
Steps and Plots tabs, history, compare, goodput, the supervisor's stall check) reads a foreign program as it
reads the trainer. What one line of each format says is read in step_formats.py; here the evidence is
weighed.

Evidence. A line of a format is a step only once its kind of line has support: two lines of the same shape
(format, and what it reports: the names of its fields, a bar's description and total) with rising steps, or
one line that names its own step time (seeds' `dt=`, MaxText's `seconds:`, a loop's `time 12ms` or `s/step`,
Keras's `ms/step`), which nothing but a step prints. Until then its lines wait, and the kind of line that gets
support first is the program's: the lines of other kinds that waited (a JSON config dump with a "step", a
restore message `step=100 lr=...`) are dropped, never emitted. From then on a line of the same format and
shape that shares a field with that kind is a step when its step rises past the last one; a redraw of the same
step adds to it, a lower step is no step. A progress bar's newest step stays open until the bar moves on, the
job ends (`finish`) or nothing has added to it for OPEN_S (`idle`), so its redraws add to it, and a log dict
goes to the step the bar shows next (tqdm redraws the bar right after a line written under it). Another kind
of line replaces the program's only with more support than it had, on steps past its last, once the program's
has gone quiet (a bar short of its total has not: an evaluation bar nested in it is no replacement); the
events already made stay. A format given by name is the only one read, by the same rule; a regex needs no
support: each line it matches with a rising step is a step.

Step times. A step whose line gives no step time gets the time since the step before it, by the times the two
lines give themselves where both give one (`feed`'s `written`: absl's `I1127 21:44:59.518823 ...`, Python
logging's `2026-11-27 21:44:59,518`, ISO 8601; read by log_timestamps.py), else the time per step since the
oldest of the last ten steps' lines came (each event's `t`: when its line was read; lines read together, every
0.1 s, came at once, hence the ten). Every event also gets `time/train/step_avg_last10_s` over the step times
seen so far, as the trainer does.

Python 3.8+ and the standard library only; it imports nothing of the console (it runs on the workers, with
step_formats.py shipped beside it into the run folder: launch/start.py).
"""

import re
import time
from collections import deque

try:  # beside this file in the run folder, where the job runner imports this one as `step_lines`
    from step_formats import COUNTING, FORMATS, STEP_AVG_LAST10, STEP_S, readers, without_escapes
except ImportError:  # imported as tpu_console.worker.step_lines (the console, its tests)
    from tpu_console.worker.step_formats import (
        COUNTING,
        FORMATS,
        STEP_AVG_LAST10,
        STEP_S,
        readers,
        without_escapes,
    )

SOURCE = "output.log"  # the `source` of the step events made here
MAX_LINE = 1 << 20  # a longer run of bytes without a line end is passed over, not read again every round
MAX_STEP_LINE = 1 << 16  # what of a line is read for a step (a step line is far shorter)
OPEN_S = 10.0  # a bar's open step that nothing added to for this long is written (`idle`)
MAX_KINDS = 64  # kinds of line waiting for support at once
MAX_WAITING = 10000  # lines one kind keeps while it waits
# A step timed by when its line was read is timed over the last ARRIVAL_STEPS steps' lines, or further back
# until they span ARRIVAL_SPAN_S: the job runner reads output every 0.02 s while it keeps coming, so a line's
# time is known to 0.02 s, 8% of 0.25 s at worst (ten steps of 15 ms span 0.15 s). Not longer: the steps'
# time follows the program's pace late (a slow start weighs on every step of a short run). At most
# MAX_ARRIVALS.
ARRIVAL_STEPS = 10
ARRIVAL_SPAN_S = 0.25
MAX_ARRIVALS = 10000
_WRITTEN = "_written"  # a step event's line's own time while the event waits (never written out)
_LINE_END = re.compile(rb"\r\n|[\r\n]|\x08+")


def complete_lines(data, final=False):
    """(lines, used): the text lines of `data` (bytes) up to its last line end, and how many bytes that
    is; with `final` (the job ended), all of it. A line ends at `\\n`, `\\r\\n`, `\\r` or a run of `\\b`, so
    each state of a redrawn progress bar is a line of its own. A run longer than MAX_LINE with no end is
    passed over whole."""
    ends = list(_LINE_END.finditer(data))
    used = len(data) if final else (ends[-1].end() if ends else 0)
    if used == 0 and len(data) > MAX_LINE:
        used = len(data)
    lines, start = [], 0
    for end in ends:
        if end.start() >= used:
            break
        lines.append(data[start:end.start()])
        start = end.end()
    if start < used:
        lines.append(data[start:used])
    return [raw.decode("utf-8", "replace") for raw in lines if raw], used


# ---- the evidence ----------------------------------------------------------------------------------------


class _Kind:
    """The lines of one shape that wait for support (not yet the program's)."""

    def __init__(self, reading, at):
        self.shape, self.format, self.fields = reading.shape, reading.format, reading.fields
        self.counts = reading.counts
        self.last = None  # its last step
        self.support = 0  # its lines with rising steps (that fit past the program's last step)
        self.waiting = []  # their events
        self.since = at  # the line number of its first waiting line


class StepLines:
    """Turns a job's output lines into step events, weighing the evidence (the module's docstring).
    `format`: one of FORMATS; `regex` for "regex". `format_found`: the format of the program's steps.
    `feed(line)` gives the events a line releases, `finish()` those held at the job's end."""

    def __init__(self, format="auto", regex=None, process=0):
        if format not in FORMATS:
            raise ValueError(f"unknown metrics format {format!r}; use one of {', '.join(FORMATS)}")
        self.format = format
        self.process = process
        self.format_found = None
        self.lines_read = 0
        self.steps_found = 0
        self._readers = readers(format, regex)
        self._recent = deque(maxlen=10)
        self._chosen = None  # the program's kind of step line: (shape, fields, format, counts)
        self._restart()

    def _restart(self):
        self._top = None  # the last step taken this attempt (emitted or open)
        # (step, when its line came, its own time) of the last steps emitted: ARRIVAL_STEPS, or ARRIVAL_SPAN_S
        self._arrived = deque(maxlen=MAX_ARRIVALS)
        self._open = None  # a bar's newest step, not yet emitted
        self._open_at = 0.0  # when a line last added to it
        self._kinds = {}  # other kinds of lines, waiting for support
        self._held = {}  # a log dict's metrics, for the step the bar shows next
        self._ended = False  # the program said training ended (Hugging Face's summary)
        self._chosen_support = 0
        self._chosen_at = 0  # the line number of its last line
        self._chosen_unfinished = False
        for reader in self._readers:
            if hasattr(reader, "restart"):
                reader.restart()

    # ---- reading -------------------------------------------------------------------------------------

    def _read(self, line):
        line = line[:MAX_STEP_LINE]
        line = without_escapes(line)
        for reader in self._readers:
            reading = reader(line)
            if reading is not None:
                return reading
        return None

    def feed(self, line, now=None, written=None):
        """The step events this line releases (none, its own, or those of its kind that waited for it).
        `now`: when the line came (the events' `t`); `written`: the time the line itself gives, in seconds
        (log_timestamps.timestamp), or None."""
        self.lines_read += 1
        reading = self._read(line)
        if reading is None:
            return []
        if reading.end:
            events = self._close()
            self._ended = True
            return events
        if reading.step is None:
            self._held.update(reading.metrics)
            return []
        if self._ended:
            return []
        event = {"t": time.time() if now is None else now, "kind": "step", "process": self.process,
                 "source": SOURCE, "format": reading.format, "step": reading.step}
        event.update(reading.metrics)
        if written is not None:
            event[_WRITTEN] = written  # taken off again when the event is emitted
        if self._is_chosen(reading):
            return self._chosen_line(reading, event)
        return self._other_line(reading, event)

    def event(self, line, now=None, written=None):
        """The newest step event this line releases, or None (`feed` gives all of them: a line that gives
        its kind support releases the lines that waited too)."""
        events = self.feed(line, now, written)
        return events[-1] if events else None

    def idle(self, now=None):
        """The open step, once no line has added to it for OPEN_S: a bar that stopped (its last step, an
        evaluation after it) shows its step without waiting for the next or for the job's end."""
        now = time.time() if now is None else now
        return self._close() if self._open is not None and now - self._open_at >= OPEN_S else []

    def finish(self):
        """The events held at the job's end (a bar's open step); then the next attempt starts afresh,
        with the program's kind of step line known."""
        events = self._close()
        self._restart()
        return events

    # ---- the program's kind of line, and the others ------------------------------------------------------

    def _is_chosen(self, reading):
        if self._chosen is None:
            return False
        shape, fields, _, _ = self._chosen
        # a line of the program's kind shares a field with it (a restore message's `lr` alone is another)
        return reading.shape == shape and (bool(reading.fields & fields) or fields == reading.fields)

    def _chosen_line(self, reading, event):
        self._chosen_at = self.lines_read
        self._chosen_unfinished = reading.unfinished
        if self._open is not None and reading.step == self._open["step"]:
            self._open.update(reading.metrics)  # a redraw of the open step: its newest values
            self._open.update(self._take_held())
            self._open_at = event["t"]
            return []
        if reading.empty or self._top is not None and reading.step <= self._top:
            return []  # a bar with nothing counted yet, an earlier state redrawn, a step that does not fit
        self._chosen_support += 1
        return self._take(event, reading.counts)

    def _other_line(self, reading, event):
        kind = self._kinds.get(reading.shape + (reading.fields,))
        if kind is None:
            if len(self._kinds) >= MAX_KINDS:  # lines of ever new shapes: the oldest kind is forgotten
                del self._kinds[min(self._kinds, key=lambda key: self._kinds[key].since)]
            kind = self._kinds[reading.shape + (reading.fields,)] = _Kind(reading, self.lines_read)
        if kind.last is not None and reading.step <= kind.last:
            if reading.step == kind.last and kind.waiting and kind.waiting[-1]["step"] == reading.step:
                kind.waiting[-1].update(reading.metrics)  # a redraw
                return []
            kind.last, kind.support, kind.waiting, kind.since = None, 0, [], self.lines_read  # it starts over
        kind.last = reading.step
        if self._top is not None and reading.step <= self._top:
            return []  # no support: it does not go past the program's last step
        if not reading.empty:
            if not kind.waiting:
                kind.since = self.lines_read
            if self._chosen is None:  # once the program's kind is known, a log dict is for its steps
                event.update(self._take_held())
            kind.waiting.append(event)
            del kind.waiting[:-MAX_WAITING]
        kind.support += 1
        if self._chosen is None:
            enough = kind.support >= 2 or reading.sure or self.format == "regex"
        else:
            enough = (kind.support > self._chosen_support and self._chosen_at < kind.since
                      and not self._chosen_unfinished)
        return self._choose(kind, reading) if enough and kind.waiting else []

    def _choose(self, kind, reading):
        """`kind` becomes the program's kind of step line: its waiting lines are steps."""
        events = self._close()
        self._chosen = (kind.shape, kind.fields, kind.format, kind.counts)
        self.format_found = kind.format
        self._chosen_support = len(kind.waiting)
        self._chosen_at = self.lines_read
        self._chosen_unfinished = reading.unfinished
        waiting = [e for e in kind.waiting if self._top is None or e["step"] > self._top]
        self._kinds = {}
        for event in waiting[:-1]:
            events += self._emit(event)
        return events + (self._take(waiting[-1], kind.counts) if waiting else [])

    def _take(self, event, counts):
        """A new step of the program's: a bar's stays open, a line's is emitted."""
        events = self._close()
        self._top = event["step"]
        event.update(self._take_held())
        if counts:
            self._open, self._open_at = event, event["t"]
            return events
        return events + self._emit(event)

    def _take_held(self):
        held, self._held = self._held, {}
        return held

    def _close(self):
        if self._open is None:
            return []
        event, self._open = self._open, None
        return self._emit(event)

    def _emit(self, event):
        self.steps_found += 1
        written = event.pop(_WRITTEN, None)
        if event.get(STEP_S) is None and self._arrived:
            # no step time printed: the time per step since the last step's line by the times both lines
            # give (exact; not one that goes back: over New Year's, a clock set back), else since the
            # oldest line kept came (lines read together came at once: ARRIVAL_SPAN_S)
            last_step, _, last_written = self._arrived[-1]
            step, t, _ = self._arrived[0]
            exact = written is not None and last_written is not None and written > last_written
            if exact and event["step"] > last_step:
                event[STEP_S] = (written - last_written) / (event["step"] - last_step)
            elif event["step"] > step and event["t"] > t:
                event[STEP_S] = (event["t"] - t) / (event["step"] - step)
        self._arrived.append((event["step"], event["t"], written))
        while len(self._arrived) > ARRIVAL_STEPS and event["t"] - self._arrived[1][1] >= ARRIVAL_SPAN_S:
            self._arrived.popleft()  # the rest still make ten and span the time
        step_s = event.get(STEP_S)
        if isinstance(step_s, (int, float)):
            self._recent.append(step_s)
        if self._recent and STEP_AVG_LAST10 not in event:
            event[STEP_AVG_LAST10] = sum(self._recent) / len(self._recent)
        return [event]


def steps_counted(events):
    """How many steps a run's step events account for: one an event for a format that prints a line a step,
    and for a progress bar (COUNTING) the count it reached, since a bar redrawn at most every 0.1 s skips
    numbers it counted."""
    total, previous = 0, None
    for event in events:
        if event.get("format") in COUNTING:
            base = previous["step"] if previous is not None and previous.get("format") in COUNTING else 0
            if previous is not None and previous.get("format") in COUNTING and event["step"] < base:
                base = 0  # a new attempt's bar
            total += event["step"] - base
        else:
            total += 1
        previous = event
    return total
