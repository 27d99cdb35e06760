"""Which providers a configuration enables, and finding a node by name across them.

Provider modules are imported only when enabled, so a laptop without gcp configured never loads the
Google client libraries.
"""

from __future__ import annotations

import asyncio

from tpu_console.domain import Node
from tpu_console.errors import NotFound, UnknownNode, UserError, close_names
from tpu_console.providers.base import NodeListing, Provider
from tpu_console.settings import Settings

# Every provider tpu-console knows, in the order listings show them.
KNOWN_PROVIDERS = ("local", "ssh", "gcp")
SUGGEST_TIMEOUT_S = 15.0  # the listing a "did you mean" is drawn from; none past it


def build_providers(settings: Settings) -> dict[str, Provider]:
    """The enabled providers by name: local unless `local.enabled = false`, ssh when `[[ssh.nodes]]`
    exist, gcp when a project is configured."""
    providers: dict[str, Provider] = {}
    if settings.local.enabled:
        from tpu_console.providers.local import LocalProvider

        providers["local"] = LocalProvider(settings)
    if settings.ssh.nodes:
        from tpu_console.providers.ssh import SshProvider

        providers["ssh"] = SshProvider(settings)
    if settings.gcp.project:
        from tpu_console.providers.gcp import GcpProvider

        providers["gcp"] = GcpProvider(settings)
    return providers


def why_not_enabled(name: str) -> str:
    """The fix for a provider that is known but not enabled by the configuration."""
    return {
        "local": "the local provider is disabled; set `[local] enabled = true` in config.toml",
        "ssh": "no ssh nodes are configured; add `[[ssh.nodes]]` entries to config.toml",
        "gcp": "the gcp provider is not configured; pass --project or set `[gcp] project` in config.toml",
    }[name]


def pick_provider(providers: dict[str, Provider], name: str) -> Provider:
    """The provider called `name`, or a UserError saying how to enable it."""
    if name in providers:
        return providers[name]
    if name in KNOWN_PROVIDERS:
        raise UserError(why_not_enabled(name))
    raise UserError(f"unknown provider {name!r}: use one of {', '.join(KNOWN_PROVIDERS)}")


def create_provider_name(settings: Settings, requested: str | None = None) -> str:
    """Which provider `create` uses: the --provider flag, else `default_provider`, else gcp when a
    project is configured, else local."""
    if requested:
        return requested
    if settings.default_provider:
        return settings.default_provider
    return "gcp" if settings.gcp.project else "local"


async def find_node(providers: dict[str, Provider], name: str) -> tuple[Provider, Node]:
    """The provider holding node `name` and the node. Asks every provider at once.

    Raises NotFound when no provider has it; when a provider could not be asked (network, credentials),
    the message says so, since the node may be there.
    """
    names = list(providers)
    answers = await asyncio.gather(*(providers[p].get(name) for p in names), return_exceptions=True)
    found = [
        (providers[p], answer) for p, answer in zip(names, answers, strict=True) if isinstance(answer, Node)
    ]
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        where = " and ".join(provider.name for provider, _ in found)
        raise UserError(f"node name {name!r} exists in {where}; rename or delete one of them")
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, Exception):
            raise answer  # cancellation and interrupts are not lookup failures
    failures = [
        f"{p}: {answer}"
        for p, answer in zip(names, answers, strict=True)
        if isinstance(answer, Exception) and not isinstance(answer, NotFound)
    ]
    if failures:
        raise NotFound(
            f"node {name!r} not found, and could not ask {'; '.join(failures)}; fix that and retry"
        )
    raise UnknownNode(name, close_names(name, await _node_names(providers)))


async def _node_names(providers: dict[str, Provider]) -> list[str]:
    """Every provider's node names, for a "did you mean" (none from a provider that cannot list in time)."""
    try:
        listings = await asyncio.wait_for(
            asyncio.gather(*(p.list_nodes() for p in providers.values()), return_exceptions=True),
            SUGGEST_TIMEOUT_S,
        )
    except TimeoutError:
        return []
    return [node.name for listing in listings if isinstance(listing, NodeListing) for node in listing.nodes]


async def close_providers(providers: dict[str, Provider]) -> None:
    await asyncio.gather(*(provider.close() for provider in providers.values()), return_exceptions=True)
