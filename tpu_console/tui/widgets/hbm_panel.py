"""Device memory (HBM) per worker, from two sources side by side, as bars and numbers.

The trainer reports, per worker, the fullest of its devices at its last step (`memory/train/*_max_gib`):
in use and peak against the limit, drawn as a bar. libtpu's runtime metrics (observe/device_metrics.py) are
read live from the TPU runtime, independent of the trainer (so they show even while it hangs): HBM in use
of the fullest device and the mean duty cycle per worker, and every device of the followed worker below
the table. Where a platform reports nothing (CPU pods give null; libtpu answers nothing there) a cell says
"not reported": a made-up number would be worse than none. Near the limit the bar turns red and the panel
says so, before RESOURCE_EXHAUSTED does.
"""

from __future__ import annotations

import statistics

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tpu_console.observe.device_metrics import DeviceMetrics, WorkerDeviceMetrics
from tpu_console.tui.run_snapshot import (
    HBM_NEAR_LIMIT,
    DeviceReadings,
    RunSnapshot,
    WorkerRow,
    fraction_level,
    memory_level,
)

BAR_WIDTH = 30
GIB = float(1 << 30)
LEVEL_STYLE = {"ok": "green", "warn": "yellow", "bad": "bold red", "unknown": "dim"}


class HbmPanel(Static):
    DEFAULT_CSS = """
    HbmPanel {
        height: auto;
        padding: 0 1;
    }
    """

    def show(
        self, snapshot: RunSnapshot | None, selected: int | None, devices: DeviceReadings | None
    ) -> None:
        self.update(memory_table(snapshot, selected, devices))


def memory_table(
    snapshot: RunSnapshot | None, selected: int | None, devices: DeviceReadings | None
) -> Group | Text:
    """`devices`: libtpu's last reading, None while none has been made."""
    if snapshot is None or not snapshot.workers:
        return Text("waiting for the run...", style="dim")
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("W")
    table.add_column(f"IN USE {'█'} / PEAK {'▒'} / LIMIT", no_wrap=True)
    table.add_column("IN USE", justify="right")
    table.add_column("PEAK", justify="right")
    table.add_column("LIMIT", justify="right")
    table.add_column("PEAK %", justify="right")
    table.add_column("LIBTPU HBM", justify="right", no_wrap=True)
    table.add_column("DUTY", justify="right")
    near: list[int] = []
    for row in snapshot.workers:
        level = memory_level(
            row.mem_peak_gib if row.mem_peak_gib is not None else row.mem_in_use_gib, row.mem_limit_gib
        )
        name = Text(f"{row.worker}", style="reverse" if row.worker == selected else "")
        live = devices.by_worker.get(row.worker) if devices is not None else None
        hbm, duty, live_level = live_cells(live, devices is not None)
        if level == "bad" or live_level == "bad":
            near.append(row.worker)
        if level == "unknown":
            table.add_row(name, Text("not reported", style="dim"), "-", "-", "-", "-", hbm, duty)
            continue
        peak = row.mem_peak_gib if row.mem_peak_gib is not None else row.mem_in_use_gib
        table.add_row(
            name,
            memory_bar(row, LEVEL_STYLE[level]),
            _gib(row.mem_in_use_gib),
            _gib(row.mem_peak_gib),
            _gib(row.mem_limit_gib),
            Text(f"{peak / row.mem_limit_gib:.0%}", style=LEVEL_STYLE[level]),
            hbm,
            duty,
        )
    lines: list = [table, Text("")]
    if near:
        workers = ", ".join(f"W{w}" for w in near)
        lines.append(
            Text(
                f"near the limit (>= {HBM_NEAR_LIMIT:.0%}): {workers}; a larger batch or longer "
                "samples will fail with RESOURCE_EXHAUSTED",
                style="bold red",
            )
        )
    elif all(memory_level(r.mem_in_use_gib, r.mem_limit_gib) == "unknown" for r in snapshot.workers):
        lines.append(
            Text(
                "the trainer reports no device memory on this platform (CPU devices); on TPUs it shows here",
                style="dim",
            )
        )
    lines.extend(libtpu_notes(devices, selected))
    return Group(*lines)


def live_cells(live: WorkerDeviceMetrics | None, read: bool) -> tuple[Text, Text, str]:
    """(HBM cell, duty cell, level) of one worker from libtpu: its fullest device and the mean duty cycle."""
    if live is None:
        return Text("-" if read else "...", style="dim"), Text(""), "unknown"
    if live.not_reported or not live.devices:
        return Text("not reported", style="dim"), Text("-", style="dim"), "unknown"
    fullest = max(live.devices, key=lambda d: d.hbm_fraction or 0.0)
    level = fraction_level(fullest.hbm_fraction)
    duties = [d.duty_cycle_pct for d in live.devices if d.duty_cycle_pct is not None]
    duty = Text(f"{statistics.mean(duties):.0f}%") if duties else Text("-", style="dim")
    return Text(device_hbm(fullest), style=LEVEL_STYLE[level]), duty, level


def libtpu_notes(devices: DeviceReadings | None, selected: int | None) -> list[Text]:
    """Below the table: where the live columns come from, why they are empty, and every device of the
    followed worker."""
    if devices is None:
        return [Text("LIBTPU: reading the TPU runtime's live metrics...", style="dim")]
    reasons = {m.not_reported for m in devices.by_worker.values() if m.not_reported}
    if devices.problem:  # the cells keep the last reading, if there was one
        notes = [Text(f"LIBTPU: {devices.problem}", style="dim")]
    elif len(reasons) == 1 and all(m.not_reported for m in devices.by_worker.values()):
        notes = [Text(f"LIBTPU: not reported: {reasons.pop()}", style="dim")]
    else:
        notes = [
            Text(
                "LIBTPU: live from the TPU runtime (fullest device, mean duty cycle), even while the "
                "trainer hangs",
                style="dim",
            )
        ]
    followed = devices.by_worker.get(selected) if selected is not None else None
    if followed is not None and followed.devices:
        line = Text(f"W{selected} devices:", style="bold")
        for d in followed.devices:
            line.append(f"  {d.device}: ")
            line.append(device_hbm(d), style=LEVEL_STYLE[fraction_level(d.hbm_fraction)])
            if d.duty_cycle_pct is not None:
                line.append(f" {d.duty_cycle_pct:.0f}%")
        notes.append(line)
    return notes


def device_hbm(device: DeviceMetrics) -> str:
    """`15.0/16.0G`: in use over total of one device."""
    used = "-" if device.hbm_used_bytes is None else f"{device.hbm_used_bytes / GIB:.1f}"
    total = "-" if device.hbm_total_bytes is None else f"{device.hbm_total_bytes / GIB:.1f}"
    return f"{used}/{total}G"


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
