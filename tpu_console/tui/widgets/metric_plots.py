"""Step time, valid tokens/s and mean reward over steps, side by side (textual-plotext).

Tokens/s and reward are run-wide numbers (the trainer gathers them over every process), so one line is
drawn: the median of what the workers reported. Step time also gets the followed worker's own line, so a
straggler shows as a line above the median.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual_plotext import PlotextPlot

from tpu_console.tui.run_snapshot import StepHistory


class MetricPlot(PlotextPlot):
    DEFAULT_CSS = """
    MetricPlot {
        width: 1fr;
        height: 1fr;
        min-height: 8;
    }
    """


class MetricPlots(Horizontal):
    DEFAULT_CSS = """
    MetricPlots {
        height: 1fr;
    }
    """

    def compose(self) -> ComposeResult:
        yield MetricPlot(id="plot-step-time")
        yield MetricPlot(id="plot-tokens")
        yield MetricPlot(id="plot-reward")

    def show(self, history: StepHistory, selected: int | None) -> None:
        step_time = self.query_one("#plot-step-time", MetricPlot)
        median = history.series(lambda m: m.step_s)
        lines = [("median", median)]
        if selected is not None and len(history.by_worker) > 1:
            lines.append((f"W{selected}", history.series(lambda m: m.step_s, selected)))
        draw(step_time, "step time (s)", lines)
        draw(self.query_one("#plot-tokens", MetricPlot), "valid tokens/s",
             [("", history.series(lambda m: m.tokens_per_s))])
        draw(self.query_one("#plot-reward", MetricPlot), "mean reward",
             [("", history.series(lambda m: m.reward_mean))])


def draw(plot: MetricPlot, title: str, lines: list[tuple[str, tuple[list[int], list[float]]]]) -> None:
    plt = plot.plt
    plt.clear_data()
    plt.clear_figure()
    plt.title(title)
    plt.xlabel("step")
    drawn = False
    for label, (steps, values) in lines:
        if steps:
            plt.plot(steps, values, label=label or None, marker="braille")
            drawn = True
    if not drawn:
        plt.title(f"{title}: no steps yet")
    plot.refresh()
