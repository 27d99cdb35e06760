"""Nodes across every enabled provider, for the CLI and the TUI: list, create (a name free in every provider),
delete (a node, or a queued request that has no node yet), and cancel what an interrupted create left queued.

Each returns plain data and raises UserError for bad input before anything remote changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tpu_console.domain import CreateRequest, Node, QueuedRequest, validate_node_name
from tpu_console.errors import AlreadyExists, CreateInterrupted, NotFound, UserError, one_line
from tpu_console.providers.base import NodeListing, Progress, Provider, no_progress
from tpu_console.providers.registry import find_node, pick_provider


async def list_nodes(providers: dict[str, Provider], provider: str | None = None) -> NodeListing:
    """Nodes of every enabled provider (or only `provider`), asked concurrently.

    A provider that fails contributes a problem line instead of failing the whole listing.
    """
    chosen = {provider: pick_provider(providers, provider)} if provider else dict(providers)
    names = list(chosen)
    answers = await asyncio.gather(*(chosen[p].list_nodes() for p in names), return_exceptions=True)
    result = NodeListing()
    for name, answer in zip(names, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer
            result.problems.append(f"{name}: {one_line(answer)}")
            continue
        result.nodes.extend(answer.nodes)
        result.requests.extend(answer.requests)
        result.problems.extend(f"{name}: {problem}" for problem in answer.problems)
    result.nodes.sort(key=lambda node: (node.provider, node.name))
    return result


async def create_node(
    providers: dict[str, Provider],
    provider: str,
    request: CreateRequest,
    progress: Progress = no_progress,
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
    progress: Progress = no_progress,
    confirm: Callable[[Node | QueuedRequest], None] | None = None,
) -> Node | QueuedRequest:
    """Delete node `name` (with its queued request, if any), or the queued request `name` that has no
    node yet; return it as it was. Every other queued request called `name` that has no node (left in
    other zones by a race, say) goes too, each confirmed gone. `confirm` may raise UserError to refuse."""
    listing = await list_nodes(providers)
    leftovers = [r for r in listing.requests if r.name == name and not r.has_node]
    try:
        provider, found = await find_node(providers, name)
    except NotFound:
        if not leftovers:
            raise
        found = leftovers.pop(0)
        provider = providers[found.provider]
    if confirm is not None:
        confirm(found)
    if isinstance(found, QueuedRequest):
        await provider.delete_queued(found, progress)
    else:
        await provider.delete(name, progress)
    for request in leftovers:
        progress(f"{request.zone}: deleting the queued request {name} ({request.state}) left there too")
        await providers[request.provider].delete_queued(request, progress)
    return found


async def delete_request(
    providers: dict[str, Provider], request: QueuedRequest, progress: Progress = no_progress
) -> None:
    """Delete this one queued request, in its own zone (another of the same name is left alone)."""
    await pick_provider(providers, request.provider).delete_queued(request, progress)


async def cancel_queued(
    providers: dict[str, Provider], interrupted: CreateInterrupted, progress: Progress = no_progress
) -> None:
    """Delete the queued requests an interrupted create left, confirming each is gone."""
    await pick_provider(providers, interrupted.provider).cancel_requests(interrupted.requests, progress)
