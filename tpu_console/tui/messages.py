"""Typed messages between the app's data feeds and its screens and widgets."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.message import Message

from tpu_console.history.events import StepMetrics
from tpu_console.observe.device_metrics import WorkerDeviceMetrics
from tpu_console.tui.run_snapshot import RunSnapshot

if TYPE_CHECKING:
    from tpu_console.observe.lookup import RunView
    from tpu_console.tui.nodes_feed import NodesListing

# -- the nodes screen (its refresh worker and its operations -> NodesScreen) ----------------------------


class NodesRefreshed(Message):
    """A fresh listing: every provider's nodes, their problems, each node's latest run and the idle ones.
    `history_only`: only the runs were read again (the history changed), the nodes are as listed before."""

    def __init__(self, listing: NodesListing, history_only: bool = False) -> None:
        super().__init__()
        self.listing = listing
        self.history_only = history_only


class OperationProgress(Message):
    """One line of a long operation (create, delete, bootstrap, sync, launch, stop) as it happens.
    Posted rather than written straight to the panel: progress callbacks may run in a thread."""

    def __init__(self, operation: str, text: str, style: str = "") -> None:
        super().__init__()
        self.operation = operation
        self.text = text
        self.style = style


class OperationEnded(Message):
    """A long operation is over: `problem` is None when it succeeded, else why it did not."""

    def __init__(self, operation: str, outcome: str, problem: str | None = None) -> None:
        super().__init__()
        self.operation = operation
        self.outcome = outcome
        self.problem = problem


# -- the runs screen (its listing worker -> RunsScreen) ---------------------------------------------------


class RunsListed(Message):
    """The run history, unfinished runs probed; `problem` when it could not be read."""

    def __init__(self, views: list[RunView], problem: str | None = None) -> None:
        super().__init__()
        self.views = views
        self.problem = problem


# -- the run dashboard (RunFeed -> RunScreen) ------------------------------------------------------------


class RunUpdated(Message):
    """A fresh look at the whole run: every worker's state, the verdict once it ended."""

    def __init__(self, snapshot: RunSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class RunStepsArrived(Message):
    """Step metrics that the dashboard may not have seen yet, by worker (one message for every worker's
    steps since the last: on a large pod a step reaches every worker at once)."""

    def __init__(self, by_worker: dict[int, list[StepMetrics]]) -> None:
        super().__init__()
        self.by_worker = by_worker


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


class RunSupervisorDecided(Message):
    """The run's supervisor on the pod decided something (stopped the others, restarts, deletes the node):
    one line each, as it wrote them (observe/supervision.py)."""

    def __init__(self, decisions: list[str]) -> None:
        super().__init__()
        self.decisions = decisions


class RunSignatureFound(Message):
    """A worker's log says what went wrong (observe/signatures.py: out of HBM, the wrong process count, TPU in
    use, a jax.distributed timeout, a traceback, a wandb error): its `kind`, and `message` with the fix."""

    def __init__(self, worker: int, kind: str, message: str) -> None:
        super().__init__()
        self.worker = worker
        self.kind = kind
        self.message = message


class RunDevicesRead(Message):
    """libtpu's live metrics of every device of every worker (HBM in use and total, duty cycle), or
    `problem`: why none could be read."""

    def __init__(self, workers: list[WorkerDeviceMetrics], problem: str | None = None) -> None:
        super().__init__()
        self.workers = workers
        self.problem = problem
