"""How the console reaches a gcp node's workers: the node read fresh (it must be READY), the console's key
installed (OS Login once, or each node's `ssh-keys` metadata), and every worker's host keys read from guest
attributes and pinned (ssh_access.py). A multislice's workers are numbered slice by slice."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from tpu_console import ssh_identity
from tpu_console.domain import Node, NodeState, SshTarget
from tpu_console.errors import NotFound, UserError
from tpu_console.providers.gcp import ssh_access
from tpu_console.providers.gcp.client import load_credentials, oslogin_endpoint
from tpu_console.providers.gcp.errors import API_ERRORS, FailureKind, classify_exception
from tpu_console.providers.gcp.node_mapping import node_path, state_hint
from tpu_console.providers.gcp.queued import try_every
from tpu_console.settings import GcpSettings


class SshHost(Protocol):
    """What reaching the workers uses of the provider (GcpProvider): its settings, client and lookups."""

    project: str
    poll_interval: float
    host_key_wait: float
    _settings: GcpSettings

    async def _client(self): ...
    def _model(self, api_node, maintenance=None) -> Node: ...
    async def _find(self, name: str): ...
    async def _find_multislice(self, name: str) -> tuple[Node, list] | None: ...


async def ssh_targets(provider: SshHost, node: Node) -> list[SshTarget]:
    """Every worker of the node; of a multislice, every worker of every slice, numbered slice by
    slice (slice 0's hosts first), each slice's host keys pinned on its own node."""
    if node.slices > 1:
        group = await provider._find_multislice(node.queued_request or node.name)
        if group is None:
            raise NotFound(f"gcp multislice {node.name!r} is gone from {node.zone}")
        current, api_nodes = group
    else:
        api_node = await provider._find(node.name) if node.zone is None else await _get_fresh(provider, node)
        current, api_nodes = provider._model(api_node), [api_node]
    if current.state is not NodeState.READY:
        hint = state_hint(current) or ""
        raise UserError(
            f"cannot connect to {current.name}: it is {current.state}, not READY"
            + (f"; {hint}" if hint else "")
        )
    username = await _login(provider, api_nodes)
    client_key = ssh_identity.client_key_path()
    targets: list[SshTarget] = []
    for api_node in api_nodes:  # in slice order: worker indexes go on from the slice before
        one = provider._model(api_node)
        observed = await _host_keys(provider, api_node.name, len(one.workers))
        trusted = ssh_access.check_and_pin(api_node.name, str(api_node.id), observed)
        for worker, keys_of_worker in zip(one.workers, trusted, strict=True):
            if not worker.host:
                raise UserError(
                    f"worker {worker.index} of {one.name} has no IP address yet; retry shortly"
                )
            targets.append(
                SshTarget(
                    worker=len(targets),
                    host=worker.host,
                    port=worker.port,
                    username=username,
                    client_key=client_key,
                    host_keys=keys_of_worker,
                )
            )
    return targets


async def _login(provider: SshHost, api_nodes: list) -> str:
    """Install the console's key (OS Login, once; or each node's ssh-keys metadata) and return the
    user the console logs in as."""
    settings = provider._settings
    api = await provider._client()
    public_key = ssh_identity.public_key_line()
    metadata = dict(api_nodes[0].metadata)
    if settings.oslogin_user or ssh_access.oslogin_enabled(metadata):
        if not settings.oslogin_user:
            raise UserError(
                f'{api_nodes[0].name.rsplit("/", 1)[-1]} uses OS Login: set [gcp] oslogin_user = '
                '"you@example.com" (your Google account) in config.toml'
            )
        credentials = await asyncio.to_thread(load_credentials, settings.api_endpoint)
        return await ssh_access.import_oslogin_key(
            credentials,
            oslogin_endpoint(settings),
            settings.oslogin_user,
            public_key,
        )
    username = settings.ssh_user
    await try_every(
        ssh_access.ensure_metadata_key(api, api_node.name, username, public_key,
                                       retry_delay=provider.poll_interval)
        for api_node in api_nodes
    )
    return username


async def _get_fresh(provider: SshHost, node: Node):
    try:
        api = await provider._client()
        return await api.get_node(node_path(provider.project, node.zone or "-", node.name))
    except API_ERRORS as exc:
        failure = classify_exception(exc)
        if failure.kind is FailureKind.NOT_FOUND:
            raise NotFound(f"gcp node {node.name!r} is gone from {node.zone}") from None
        raise UserError(f"could not read {node.name}: {failure.describe()}") from None


async def _host_keys(provider: SshHost, path: str, workers: int) -> list[list[str]]:
    """Host keys of every worker; a node that has just become READY may need a moment to publish."""
    api = await provider._client()
    deadline = time.monotonic() + provider.host_key_wait
    while True:
        observed = ssh_access.host_keys_from_guest_attributes(
            await api.guest_attributes(path, ssh_access.HOST_KEYS_QUERY)
        )
        missing = [i for i in range(workers) if i >= len(observed) or not observed[i]]
        if not missing:
            return observed[:workers]
        if time.monotonic() >= deadline:
            raise UserError(
                f"workers {', '.join(map(str, missing))} of {path} have not published their "
                "SSH host keys (guest attributes); retry in a minute"
            )
        await asyncio.sleep(provider.poll_interval)
