"""Typed messages between the app's data feeds and its screens and widgets."""

from __future__ import annotations

from textual.message import Message

from tpu_console.runs.events import StepMetrics
from tpu_console.tui.run_snapshot import RunSnapshot

# -- the run dashboard (RunFeed -> RunScreen) ------------------------------------------------------------


class RunUpdated(Message):
    """A fresh look at the whole run: every worker's state, the verdict once it ended."""

    def __init__(self, snapshot: RunSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class RunStepsArrived(Message):
    """Step metrics of one worker that the dashboard may not have seen yet."""

    def __init__(self, worker: int, steps: list[StepMetrics]) -> None:
        super().__init__()
        self.worker = worker
        self.steps = steps


class RunLogLines(Message):
    """New lines of the workers' output.log, already masked, in arrival order: (worker, text)."""

    def __init__(self, lines: list[tuple[int, str]]) -> None:
        super().__init__()
        self.lines = lines


class RunFeedProblem(Message):
    """The run could not be read just now (the feed keeps trying); None when it can be read again."""

    def __init__(self, problem: str | None) -> None:
        super().__init__()
        self.problem = problem
