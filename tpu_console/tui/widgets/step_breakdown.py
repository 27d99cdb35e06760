"""Where a step's time goes: each phase of the last step, for the followed worker and across workers.

Each phase shows the slowest worker with how many times the others' median it took. Which workers are
stragglers (on a pod every worker waits for the slowest one at the next collective) is the watcher's
judgement (observe/health.py: step or phase time 1.5x the others' median), shown in red and listed below.
"""

from __future__ import annotations

import statistics

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tpu_console.history.events import StepMetrics
from tpu_console.tui.run_snapshot import PHASES, phase_seconds, slowness

STRAGGLER_STYLE = "bold red"


class StepBreakdown(Static):
    DEFAULT_CSS = """
    StepBreakdown {
        height: auto;
        padding: 0 1;
    }
    """

    def show(
        self, latest: dict[int, StepMetrics], selected: int | None, stragglers: dict[int, str],
        note: str | None = None,
    ) -> None:
        self.update(breakdown(latest, selected, stragglers, note))


def phase_names(latest: dict[int, StepMetrics]) -> list[str]:
    """The GRPO phases in the order they run, then any other a program reports (its own names, sorted),
    then `step`, their total."""
    others = sorted({p for m in latest.values() for p in m.phases} - set(PHASES))
    return [p for p in PHASES if p != "step"] + others + ["step"]


def breakdown(
    latest: dict[int, StepMetrics], selected: int | None, stragglers: dict[int, str], note: str | None = None
) -> Group | Text:
    """`latest`: each worker's last step; `stragglers`: the watcher's finding per straggling worker;
    `note`: where a command job's steps come from (shown under the table), or why there are none."""
    if not latest:
        return Text(note or "no step yet: the breakdown appears with the first step event", style="dim")
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
    for phase in phase_names(latest):
        values = {w: v for w, m in latest.items() if (v := phase_seconds(m, phase)) is not None}
        if not values:
            continue
        mine = values.get(followed)
        ratios = slowness(values)
        slowest = max(values, key=lambda w: values[w])
        lead = f" {ratios[slowest]:.1f}x" if ratios.get(slowest, 1.0) >= 1.05 else ""
        share = f"{mine / step_total:.0%}" if mine is not None and step_total and phase != "step" else ""
        table.add_row(
            Text(phase, style="bold" if phase == "step" else ""),
            Text(
                _seconds(mine),
                style=STRAGGLER_STYLE if followed == slowest and followed in stragglers else "",
            ),
            share,
            _seconds(statistics.median(values.values())),
            _seconds(min(values.values())),
            _seconds(values[slowest]),
            Text(f"W{slowest}{lead}", style=STRAGGLER_STYLE if slowest in stragglers else ""),
        )
    if stragglers:
        found = "; ".join(f"W{w} {why}" for w, why in sorted(stragglers.items()))
        footer = Text(f"stragglers (vs the other workers' median): {found}", style="yellow")
    else:
        footer = Text(f"no stragglers across {len(latest)} worker(s)", style="green")
    return Group(table, Text(""), footer, *([Text(note, style="dim")] if note else []))


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"
