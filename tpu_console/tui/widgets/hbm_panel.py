"""Device memory (HBM) per worker: bytes in use and peak against the limit, as bars.

The trainer reports, per worker, the fullest of its devices (`memory/train/*_max_gib`). Where the
platform reports nothing (CPU pods give null) the row says "not reported": a made-up number would be
worse than none. Near the limit the bar turns red and the panel says so, before RESOURCE_EXHAUSTED does.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tpu_console.tui.run_snapshot import HBM_NEAR_LIMIT, RunSnapshot, WorkerRow, memory_level

BAR_WIDTH = 30
LEVEL_STYLE = {"ok": "green", "warn": "yellow", "bad": "bold red", "unknown": "dim"}


class HbmPanel(Static):
    DEFAULT_CSS = """
    HbmPanel {
        height: auto;
        padding: 0 1;
    }
    """

    def show(self, snapshot: RunSnapshot | None, selected: int | None) -> None:
        self.update(memory_table(snapshot, selected))


def memory_table(snapshot: RunSnapshot | None, selected: int | None) -> Group | Text:
    if snapshot is None or not snapshot.workers:
        return Text("waiting for the run...", style="dim")
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("W")
    table.add_column(f"IN USE {'█'} / PEAK {'▒'} / LIMIT", no_wrap=True)
    table.add_column("IN USE", justify="right")
    table.add_column("PEAK", justify="right")
    table.add_column("LIMIT", justify="right")
    table.add_column("PEAK %", justify="right")
    near: list[int] = []
    for row in snapshot.workers:
        level = memory_level(row.mem_peak_gib if row.mem_peak_gib is not None else row.mem_in_use_gib,
                             row.mem_limit_gib)
        name = Text(f"{row.worker}", style="reverse" if row.worker == selected else "")
        if level == "unknown":
            table.add_row(name, Text("not reported", style="dim"), "-", "-", "-", "-")
            continue
        if level == "bad":
            near.append(row.worker)
        peak = row.mem_peak_gib if row.mem_peak_gib is not None else row.mem_in_use_gib
        table.add_row(
            name,
            memory_bar(row, LEVEL_STYLE[level]),
            _gib(row.mem_in_use_gib),
            _gib(row.mem_peak_gib),
            _gib(row.mem_limit_gib),
            Text(f"{peak / row.mem_limit_gib:.0%}", style=LEVEL_STYLE[level]),
        )
    lines: list = [table, Text("")]
    if near:
        workers = ", ".join(f"W{w}" for w in near)
        lines.append(Text(f"near the limit (peak >= {HBM_NEAR_LIMIT:.0%}): {workers}; a larger batch or longer "
                          "samples will fail with RESOURCE_EXHAUSTED", style="bold red"))
    elif all(memory_level(r.mem_in_use_gib, r.mem_limit_gib) == "unknown" for r in snapshot.workers):
        lines.append(Text("this platform reports no device memory (CPU devices); on TPUs it shows here",
                          style="dim"))
    return Group(*lines)


def memory_bar(row: WorkerRow, style: str, width: int = BAR_WIDTH) -> Text:
    limit = row.mem_limit_gib or 1.0
    used = min(width, round(width * (row.mem_in_use_gib or 0.0) / limit))
    peak = min(width, max(used, round(width * (row.mem_peak_gib or 0.0) / limit)))
    bar = Text()
    bar.append("█" * used, style=style)
    bar.append("▒" * (peak - used), style=style)
    bar.append("░" * (width - peak), style="dim")
    return bar


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}G"
