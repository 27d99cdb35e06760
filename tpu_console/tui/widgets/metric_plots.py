"""Step time, valid tokens/s and mean reward (or the loss, for a program without a reward) over steps, side
by side (textual-plotext).

Tokens/s and reward are run-wide numbers (the trainer gathers them over every process), so one line is
drawn: the median of what the workers reported. Step time also gets the followed worker's own line, so a
straggler shows as a line above the median. Steps are whole numbers, and so are the axis' ticks; with
fewer than two steps there is no line to draw, and the panel says so instead of drawing an empty frame.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from tpu_console.tui.run_snapshot import StepHistory

MAX_TICKS = 5


class MetricPlot(PlotextPlot):
    DEFAULT_CSS = """
    MetricPlot {
        width: 1fr;
        height: 1fr;
        min-height: 8;
    }
    """


class MetricPanel(Vertical):
    """One plot, or the line that says why there is none yet."""

    DEFAULT_CSS = """
    MetricPanel { width: 1fr; height: 1fr; }
    MetricPanel .too-few { height: 1fr; content-align: center middle; color: $text-muted; padding: 0 1; }
    """

    def __init__(self, plot_id: str) -> None:
        super().__init__()
        self.plot_id = plot_id

    def compose(self) -> ComposeResult:
        yield MetricPlot(id=self.plot_id)
        yield Static("", classes="too-few", id=f"{self.plot_id}-note")


class MetricPlots(Horizontal):
    DEFAULT_CSS = """
    MetricPlots {
        height: 1fr;
    }
    """
    _steps_seen = False
    _note: str | None = None

    def compose(self) -> ComposeResult:
        yield MetricPanel("plot-step-time")
        yield MetricPanel("plot-tokens")
        yield MetricPanel("plot-reward")

    def show(self, history: StepHistory, selected: int | None, note: str | None = None) -> None:
        """`note`: where a command job's steps come from, or that none of its output matched (foreign
        metrics' steps_note): said instead of "no steps yet"."""
        self._steps_seen = any(history.by_worker.values())
        self._note = note
        median = history.series(lambda m: m.step_s)
        lines = [("median", median)]
        if selected is not None and len(history.by_worker) > 1:
            lines.append((f"W{selected}", history.series(lambda m: m.step_s, selected)))
        self._draw("plot-step-time", "step time (s)", lines)
        self._draw("plot-tokens", "valid tokens/s", [("", history.series(lambda m: m.tokens_per_s))])
        reward = history.series(lambda m: m.reward_mean)
        loss = history.series(lambda m: m.loss)
        if not reward[0] and loss[0]:  # a program with no reward (MaxText, an SFT): its loss instead
            self._draw("plot-reward", "loss", [("", loss)])
        else:
            self._draw("plot-reward", "mean reward", [("", reward)])

    def _draw(self, plot_id: str, title: str, lines: list[tuple[str, tuple[list[int], list[float]]]]) -> None:
        plot = self.query_one(f"#{plot_id}", MetricPlot)
        note = self.query_one(f"#{plot_id}-note", Static)
        steps = sorted({s for _, (xs, _) in lines for s in xs})
        if len(steps) < 2:
            plot.display, note.display = False, True
            note.update(too_few_text(title, lines, self._steps_seen, self._note))
            return
        plot.display, note.display = True, False
        draw(plot, title, lines, steps)


def too_few_text(
    title: str, lines: list[tuple[str, tuple[list[int], list[float]]]], steps_seen: bool = False,
    note: str | None = None,
) -> str:
    """What a plot with no line to draw says instead: none yet (or why: `note`), that the steps carry no
    such number (a program that does not report it), or the one value there is."""
    points = [(xs[0], ys[0]) for _, (xs, ys) in lines[:1] if xs]
    if not points and steps_seen:
        return f"{title}\n\nthe steps so far do not report it"
    if not points:
        return f"{title}\n\n{note or 'no steps yet'}"
    step, value = points[0]
    return f"{title}\n\none step so far: {value:.4g} at step {step}\n(a line needs two)"


def integer_ticks(steps: list[int], most: int = MAX_TICKS) -> list[int]:
    """At most `most` whole-number ticks over the steps, evenly spaced at a round stride (1, 2, 5, 10, 20,
    25, 50 ...), as a person would label the axis: steps 1..6 give 2 4 6, 1..100 give 20 40 60 80 100."""
    first, last = steps[0], steps[-1]
    if first == last:
        return [first]
    scale = 1
    while True:
        for nice in (1, 2, 5) if scale == 1 else (1, 2, 2.5, 5):
            stride = int(nice * scale)
            if (last - first) // stride + 1 <= most:
                ticks = list(range(-(-first // stride) * stride, last + 1, stride))
                return ticks if len(ticks) >= 2 else [first, last]
        scale *= 10


def draw(
    plot: MetricPlot, title: str, lines: list[tuple[str, tuple[list[int], list[float]]]], steps: list[int]
) -> None:
    plt = plot.plt
    plt.clear_data()
    plt.clear_figure()
    plt.title(title)
    plt.xlabel("step")
    for label, (xs, values) in lines:
        if xs:
            plt.plot(xs, values, label=label or None, marker="braille")
    ticks = integer_ticks(steps)
    plt.xticks(ticks, [str(t) for t in ticks])
    plot.refresh()
