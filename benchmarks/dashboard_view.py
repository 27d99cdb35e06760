"""What the app's run dashboard shows of an ended run: its Steps and Plots tabs, read from the real app.

    TPU_CONSOLE_HOME=... .venv/bin/python benchmarks/dashboard_view.py RUN_ID [--timeout S]

Opens the terminal app headless (Textual's test driver, 160x50) with the run's dashboard on top, as
`enter` on a node opens it, waits until the dashboard's own feed has read the run to its end and no new
step arrived for a second, then presses `s` and `p` as a person would. Prints one JSON document:
- `workers`: per worker, what the dashboard holds (the steps both tabs draw from): the steps, the last
  one, the median step time and the loss of the last step;
- `steps_tab`: the Steps tab's text (the followed worker's last step and its phases);
- `plots`: per plot, whether it drew a line and its title, or the note it shows instead;
- `screen`: the text of the whole screen with the Plots tab shown.
benchmarks/programs.py runs it for every program and holds these against what `status` and the run's
archive say (program_rows.judge_dashboard). Exits 1 when the dashboard did not see the run end in time.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from textual.widgets import Static

from tpu_console.history.store import RunStore
from tpu_console.providers.registry import build_providers
from tpu_console.settings import Settings
from tpu_console.tui import app as app_module
from tpu_console.tui.app import TpuConsoleApp
from tpu_console.tui.screens.run_screen import RunScreen
from tpu_console.tui.widgets.metric_plots import MetricPlot
from tpu_console.tui.widgets.step_breakdown import StepBreakdown

PLOTS = ("plot-step-time", "plot-tokens", "plot-reward")
SETTLED_S = 1.0  # no new step for this long after the run ended: the feed has brought them all


def text_of(widget: Static) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


class DashboardOnly(TpuConsoleApp):
    """The real app, its first screen the run's dashboard (the nodes screen is not needed to read it)."""

    CSS_PATH = str(Path(app_module.__file__).with_name(TpuConsoleApp.CSS_PATH))  # relative to app.py

    def __init__(self, providers: dict, run_id: str) -> None:
        super().__init__(providers, refresh_every=3600)
        self.run_screen = RunScreen(providers, run_id, RunStore())

    def on_mount(self) -> None:
        self.push_screen(self.run_screen)


async def read(run_id: str, timeout_s: float) -> dict:
    providers = build_providers(Settings())
    app = DashboardOnly(providers, run_id)
    async with app.run_test(size=(160, 50)) as pilot:
        screen = app.run_screen
        deadline = time.monotonic() + timeout_s
        counted, settled_at = -1, time.monotonic()
        while True:
            count = sum(len(steps) for steps in screen.history.by_worker.values())
            if count != counted:
                counted, settled_at = count, time.monotonic()
            ended = screen.snapshot is not None and screen.snapshot.ended
            if ended and time.monotonic() - settled_at >= SETTLED_S:
                break
            if time.monotonic() > deadline:
                state = screen.snapshot.state if screen.snapshot else "nothing read"
                raise TimeoutError(f"the dashboard did not see {run_id} end within {timeout_s:.0f} s "
                                   f"(it shows: {state}; {screen.problem or 'no problem said'})")
            await pilot.pause(0.1)
        await pilot.press("s")
        await pilot.pause(0.3)
        steps_tab = text_of(screen.query_one(StepBreakdown))
        await pilot.press("p")
        await pilot.pause(0.5)
        plots = {}
        for plot_id in PLOTS:
            drawn = screen.query_one(f"#{plot_id}", MetricPlot).display
            note = screen.query_one(f"#{plot_id}-note", Static)
            plots[plot_id] = {"drawn": bool(drawn), "note": None if drawn else text_of(note).strip()}
        shown = app.export_screenshot()  # SVG: its text is what the terminal shows
        workers = {}
        for worker, steps in sorted(screen.history.by_worker.items()):
            ordered = [steps[s] for s in sorted(steps)]
            times = [m.step_s for m in ordered if m.step_s is not None]
            workers[str(worker)] = {
                "steps": len(ordered),
                "last": ordered[-1].step if ordered else None,
                "step_s": statistics.median(times) if times else None,
                "loss": ordered[-1].loss if ordered else None,
                "losses": sum(m.loss is not None for m in ordered),
            }
        return {"run_id": run_id, "state": screen.snapshot.state, "workers": workers, "steps_tab": steps_tab,
                "plots": plots, "plot_titles": plot_titles(shown)}


def plot_titles(svg: str) -> list[str]:
    """Which of the plots' titles the screen shows (plotext writes a plot's title on its top line)."""
    return [title for title in ("step time (s)", "valid tokens/s", "mean reward", "loss")
            if title.replace(" ", "&#160;") in svg or title in svg]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_id")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="S",
                        help="how long the dashboard may take to read the run to its end (default 120)")
    options = parser.parse_args()
    try:
        document = asyncio.run(read(options.run_id, options.timeout))
    except TimeoutError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
