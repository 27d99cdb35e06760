"""Building the TPU API client: endpoint, credentials, project; and calling it without blocking the loop.

`google.cloud.tpu_v2.TpuClient` with the REST transport is synchronous (the async client has no REST
transport), so every call goes through `asyncio.to_thread`. An `http://127.0.0.1...` endpoint is an
emulator: it gets anonymous credentials and needs no Google account.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from tpu_console.errors import UserError
from tpu_console.settings import GcpSettings

T = TypeVar("T")

DEFAULT_ENDPOINT = "https://tpu.googleapis.com"
DEFAULT_OSLOGIN_ENDPOINT = "https://oslogin.googleapis.com"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

# Transient answers worth repeating for reads: the API's own 5xx hiccups.
_TRANSIENT_HTTP = {500, 502, 503, 504}
RETRY_BASE_DELAY = 0.5  # seconds before the first repeat; doubles each time


def is_local_endpoint(endpoint: str | None) -> bool:
    """A plain-HTTP loopback endpoint is an emulator (the real service is HTTPS only)."""
    if not endpoint:
        return False
    parts = urlsplit(endpoint)
    return parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1")


def require_project(settings: GcpSettings) -> str:
    if not settings.project:
        raise UserError(
            "no GCP project: set [gcp] project in config.toml, or GOOGLE_CLOUD_PROJECT, or pass --project"
        )
    return settings.project


def load_credentials(endpoint: str | None):  # -> google.auth.credentials.Credentials
    """Anonymous for a local emulator; otherwise Application Default Credentials."""
    if is_local_endpoint(endpoint):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        credentials, _project = google.auth.default(scopes=[CLOUD_PLATFORM_SCOPE])
    except DefaultCredentialsError:
        raise UserError(
            "no Google Cloud credentials: run `gcloud auth application-default login` "
            "(or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file)"
        ) from None
    return credentials


def make_tpu_client(settings: GcpSettings):  # -> google.cloud.tpu_v2.TpuClient
    from google.cloud import tpu_v2

    endpoint = settings.api_endpoint or DEFAULT_ENDPOINT
    return tpu_v2.TpuClient(
        credentials=load_credentials(settings.api_endpoint),
        transport="rest",
        client_options={"api_endpoint": endpoint},
    )


def oslogin_endpoint(settings: GcpSettings) -> str:
    """OS Login lives on its own host; an emulator serves it on the TPU endpoint."""
    if settings.api_endpoint and is_local_endpoint(settings.api_endpoint):
        return settings.api_endpoint.rstrip("/")
    return DEFAULT_OSLOGIN_ENDPOINT


def is_transient(exc: BaseException) -> bool:
    from google.api_core import exceptions as api_exceptions

    if isinstance(exc, api_exceptions.GoogleAPICallError):
        return exc.code in _TRANSIENT_HTTP
    import requests

    return isinstance(exc, requests.ConnectionError | requests.Timeout)


async def call(fn: Callable[..., T], /, *args, attempts: int = 4, **kwargs) -> T:
    """Run a blocking client call in a thread, repeating it on transient server errors.

    Only use `attempts > 1` for calls that are safe to repeat (reads, and writes the API deduplicates).
    """
    for attempt in range(attempts):
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            # Jittered exponential backoff, so concurrent zone calls do not retry in lockstep.
            await asyncio.sleep(RETRY_BASE_DELAY * (2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


class TpuApi:
    """The few TPU API calls the provider makes, as coroutines. Reads are repeated on 5xx; writes are not
    (a repeated create could race its own first attempt)."""

    def __init__(self, client, *, poll_interval: float = 5.0):
        self._client = client
        self.poll_interval = poll_interval

    async def list_nodes(self, parent: str) -> list:
        def fetch() -> list:
            return list(self._client.list_nodes(parent=parent))  # the pager follows next_page_token

        return await call(fetch)

    async def get_node(self, path: str):
        return await call(self._client.get_node, name=path)

    async def create_node(self, parent: str, node_id: str, node) -> str:
        """Start a create; returns the operation's name."""
        future = await call(self._client.create_node, parent=parent, node_id=node_id, node=node, attempts=1)
        return future.operation.name

    async def delete_node(self, path: str) -> str:
        future = await call(self._client.delete_node, name=path, attempts=1)
        return future.operation.name

    async def update_metadata(self, path: str, metadata: dict[str, str]) -> str:
        """Replace the node's whole metadata map (the field mask `metadata` covers all of it)."""
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        node = tpu_v2.Node(name=path, metadata=metadata)
        mask = field_mask_pb2.FieldMask(paths=["metadata"])
        future = await call(self._client.update_node, node=node, update_mask=mask, attempts=1)
        return future.operation.name

    async def update_labels(self, path: str, labels: dict[str, str]) -> str:
        """Replace the node's whole label map (the field mask `labels` covers all of it)."""
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        node = tpu_v2.Node(name=path, labels=labels)
        mask = field_mask_pb2.FieldMask(paths=["labels"])
        future = await call(self._client.update_node, node=node, update_mask=mask, attempts=1)
        return future.operation.name

    async def guest_attributes(self, path: str, query_path: str) -> list:
        response = await call(
            self._client.get_guest_attributes, request={"name": path, "query_path": query_path}
        )
        return list(response.guest_attributes)

    # ---- queued resources (tpu_v2) ----------------------------------------------------------------

    async def create_queued_resource(self, parent: str, queued_resource_id: str, queued_resource) -> str:
        future = await call(self._client.create_queued_resource, parent=parent, attempts=1,
                            queued_resource_id=queued_resource_id, queued_resource=queued_resource)
        return future.operation.name

    async def get_queued_resource(self, path: str):
        return await call(self._client.get_queued_resource, name=path)

    async def list_queued_resources(self, parent: str) -> list:
        def fetch() -> list:
            return list(self._client.list_queued_resources(parent=parent))

        return await call(fetch)

    async def delete_queued_resource(self, path: str, *, force: bool) -> str:
        """`force` deletes the request's node with it (the request cannot go while its node exists)."""
        from google.cloud import tpu_v2

        request = tpu_v2.DeleteQueuedResourceRequest(name=path, force=force)
        future = await call(self._client.delete_queued_resource, request=request, attempts=1)
        return future.operation.name

    async def get_operation(self, name: str):
        return await call(self._client.get_operation, {"name": name})

    async def wait_operation(self, name: str, timeout: float, on_poll: Callable[[], object] | None = None):
        """Poll until the operation is done; returns it (check `.error.code`). Raises TimeoutError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            operation = await self.get_operation(name)
            if operation.done:
                return operation
            if on_poll is not None:
                result = on_poll()
                if asyncio.iscoroutine(result):
                    await result
            if loop.time() >= deadline:
                raise TimeoutError(f"operation {name} not done after {timeout:.0f}s")
            await asyncio.sleep(self.poll_interval)

    async def close(self) -> None:
        await asyncio.to_thread(self._client.transport.close)
