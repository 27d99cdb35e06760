"""`exec`: one command on the selected workers of a node, all or none of them reached first."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet, WorkerLine, WorkerResult
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.providers.base import Provider


@dataclass
class ExecOutcome:
    node: Node
    command: str
    results: list[WorkerResult]

    @property
    def exit_status(self) -> int:
        """The first non-zero worker status, in worker order; 255 (as ssh uses) for a worker whose command
        did not finish (connection lost, timed out); 0 when every worker succeeded."""
        for result in self.results:
            if result.error is not None or result.exit_status is None:
                return 255
            if result.exit_status != 0:
                return result.exit_status
        return 0


def command_line(argv: Sequence[str]) -> str:
    """One argument is a shell command line as is (`'cd x && ls'`); several are quoted one by one, so
    `python -c 'print(1)'` arrives exactly as typed."""
    if not argv:
        raise UserError("no command given; put it after --, e.g. `tpu-console exec NAME -- hostname`")
    return argv[0] if len(argv) == 1 else shlex.join(argv)


async def exec_on_node(
    providers: dict[str, Provider],
    name: str,
    command: str,
    workers: str = "all",
    *,
    timeout: float | None = None,
    on_line: Callable[[WorkerLine], None] | None = None,
) -> ExecOutcome:
    """Run `command` on the selected workers of node `name`.

    Every selected worker is connected to first; if one cannot be reached, nothing runs anywhere and a
    UserError names the worker, so a command never half-runs across a pod.
    """
    if not command.strip():
        raise UserError("empty command; put it after --, e.g. `tpu-console exec NAME -- hostname`")
    provider, node = await open_node(providers, name)
    selected = parse_worker_selection(workers, node.shape.workers)
    targets = await provider.ssh_targets(node)
    async with Fleet(targets) as fleet:
        await require_all_reachable(fleet, name, selected, "nothing was run")
        results = await fleet.run(command, selected, timeout=timeout, on_line=on_line)
    return ExecOutcome(node=node, command=command, results=results)
