"""The verbs a person can ask for, shared by the CLI and the TUI: list, create, delete, exec.

Each is an async function over the enabled providers that returns plain data and raises UserError for bad
input before anything remote changes. Printing and key handling stay in cli.py and tui/.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tpu_console.errors import AlreadyExists, NotFound, UserError, one_line
from tpu_console.fleet.fleet import Fleet, WorkerLine, WorkerResult
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.model import CreateRequest, Node, validate_node_name
from tpu_console.providers.base import Progress, Provider
from tpu_console.providers.registry import find_node, pick_provider


def _ignore(_line: str) -> None:
    pass


@dataclass
class NodeList:
    nodes: list[Node] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each; the listing is partial when non-empty


async def list_nodes(providers: dict[str, Provider], provider: str | None = None) -> NodeList:
    """Nodes of every enabled provider (or only `provider`), asked concurrently.

    A provider that fails contributes a problem line instead of failing the whole listing.
    """
    chosen = {provider: pick_provider(providers, provider)} if provider else dict(providers)
    names = list(chosen)
    answers = await asyncio.gather(*(chosen[p].list_nodes() for p in names), return_exceptions=True)
    result = NodeList()
    for name, answer in zip(names, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer
            result.problems.append(f"{name}: {one_line(answer)}")
            continue
        result.nodes.extend(answer.nodes)
        result.problems.extend(f"{name}: {problem}" for problem in answer.problems)
    result.nodes.sort(key=lambda node: (node.provider, node.name))
    return result


async def create_node(
    providers: dict[str, Provider],
    provider: str,
    request: CreateRequest,
    progress: Progress = _ignore,
) -> Node:
    """Create a node with `provider`, after checking the name is valid and free in every provider."""
    if problem := validate_node_name(request.name):
        raise UserError(problem)
    target = pick_provider(providers, provider)
    await _ensure_name_free(providers, request.name, progress)
    return await target.create(request, progress)


async def _ensure_name_free(providers: dict[str, Provider], name: str, progress: Progress) -> None:
    # Names must be unique across providers, because every other verb finds a node by name alone.
    async def holder(provider: Provider) -> Provider | None:
        try:
            await provider.get(name)
        except NotFound:
            return None
        except Exception as exc:  # noqa: BLE001 - the create itself will meet it, if it matters
            progress(f"could not check {provider.name} for an existing {name!r}: {one_line(exc)}")
            return None
        return provider

    holders = [p for p in await asyncio.gather(*(holder(p) for p in providers.values())) if p]
    if holders:
        raise AlreadyExists(
            f"node name {name!r} is taken (a {holders[0].name} node); pick another name "
            f"or delete it first with `tpu-console delete {name} --yes`"
        )


async def delete_node(
    providers: dict[str, Provider],
    name: str,
    progress: Progress = _ignore,
    confirm: Callable[[Node], None] | None = None,
) -> Node:
    """Delete node `name` and return it as it was. `confirm` may raise UserError to refuse."""
    provider, node = await find_node(providers, name)
    if confirm is not None:
        confirm(node)
    await provider.delete(name, progress)
    return node


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
