"""Where a step's time goes: each phase of the last step, for the followed worker and across workers.

A worker whose phase takes much longer than the other workers' is a straggler (on a pod every worker
waits for the slowest one at the next collective), flagged in yellow or red with how many times slower.
"""

from __future__ import annotations

import statistics

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tpu_console.runs.events import StepMetrics
from tpu_console.tui.run_snapshot import PHASES, phase_seconds, slowness, slowness_level, stragglers

LEVEL_STYLE = {"ok": "", "warn": "yellow", "bad": "bold red"}


class StepBreakdown(Static):
    DEFAULT_CSS = """
    StepBreakdown {
        height: auto;
        padding: 0 1;
    }
    """

    def show(self, latest: dict[int, StepMetrics], selected: int | None) -> None:
        self.update(breakdown(latest, selected))


def breakdown(latest: dict[int, StepMetrics], selected: int | None) -> Group | Text:
    if not latest:
        return Text("no step yet: the breakdown appears with the first step event", style="dim")
    followed = selected if selected in latest else min(latest)
    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    table.add_column("PHASE")
    table.add_column(f"W{followed} (step {latest[followed].step})", justify="right")
    table.add_column("SHARE", justify="right")
    table.add_column("MEDIAN", justify="right")
    table.add_column("MIN", justify="right")
    table.add_column("MAX", justify="right")
    table.add_column("SLOWEST", justify="left")
    step_total = latest[followed].step_s
    flagged: list[str] = []
    for phase in PHASES:
        values = {w: v for w, m in latest.items() if (v := phase_seconds(m, phase)) is not None}
        if not values:
            continue
        mine = values.get(followed)
        ratios = slowness(values)
        slowest = max(values, key=lambda w: values[w])
        level = slowness_level(ratios.get(slowest))
        share = f"{mine / step_total:.0%}" if mine is not None and step_total and phase != "step" else ""
        table.add_row(
            Text(phase, style="bold" if phase == "step" else ""),
            Text(_seconds(mine), style=LEVEL_STYLE[slowness_level(ratios.get(followed))]),
            share,
            _seconds(statistics.median(values.values())),
            _seconds(min(values.values())),
            _seconds(values[slowest]),
            Text(f"W{slowest}" + (f" {ratios[slowest]:.1f}x" if level != "ok" else ""), style=LEVEL_STYLE[level]),
        )
        for worker, ratio in sorted(stragglers(values).items()):
            flagged.append(f"W{worker} {phase} {ratio:.1f}x")
    if flagged:
        footer = Text("stragglers (vs the other workers' median): " + ", ".join(flagged), style="yellow")
    else:
        footer = Text(f"no stragglers across {len(latest)} worker(s)", style="green")
    return Group(table, Text(""), footer)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
