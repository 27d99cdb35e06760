"""The TPU API's v2alpha1 surface, for the two things only it has: a node's `upcoming_maintenance`, and
the best-effort tier of a queued request.

The installed google-cloud-tpu ships `tpu_v2alpha1` types but a gRPC transport only (no REST, so no
emulator and no proxy-friendly HTTPS); so these few calls are plain REST over an `AuthorizedSession`,
with the messages built and parsed by the client's own `tpu_v2alpha1` types. Errors are raised as the
client raises them (`google.api_core.exceptions`), so `errors.classify_exception` reads them alike.
"""

from __future__ import annotations

import asyncio

from tpu_console.providers.gcp.client import DEFAULT_ENDPOINT, call

_TIMEOUT_S = 60


class AlphaApi:
    def __init__(self, credentials, endpoint: str | None) -> None:
        from google.auth.transport.requests import AuthorizedSession

        self._endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self._session = AuthorizedSession(credentials)

    def _check(self, response):
        from google.api_core import exceptions as api_exceptions

        if response.status_code >= 400:
            raise api_exceptions.from_http_response(response)
        return response

    async def list_nodes(self, parent: str) -> list:
        """Every node under `parent` as `tpu_v2alpha1.Node` (with `upcoming_maintenance`)."""
        from google.cloud import tpu_v2alpha1

        def fetch() -> list:
            nodes, token = [], ""
            while True:
                params = {"pageToken": token} if token else {}
                response = self._check(self._session.get(f"{self._endpoint}/v2alpha1/{parent}/nodes",
                                                         params=params, timeout=_TIMEOUT_S))
                page = tpu_v2alpha1.ListNodesResponse.from_json(response.text, ignore_unknown_fields=True)
                nodes.extend(page.nodes)
                token = page.next_page_token
                if not token:
                    return nodes

        return await call(fetch)

    async def create_queued_resource(self, parent: str, queued_resource_id: str, queued_resource) -> str:
        """Create a `tpu_v2alpha1.QueuedResource`; returns the operation's name. Not repeated on 5xx."""
        from google.cloud import tpu_v2alpha1

        body = tpu_v2alpha1.QueuedResource.to_json(queued_resource, use_integers_for_enums=False)

        def post() -> str:
            response = self._check(self._session.post(
                f"{self._endpoint}/v2alpha1/{parent}/queuedResources",
                params={"queuedResourceId": queued_resource_id}, data=body,
                headers={"Content-Type": "application/json"}, timeout=_TIMEOUT_S))
            return response.json().get("name", "")

        return await call(post, attempts=1)

    async def close(self) -> None:
        await asyncio.to_thread(self._session.close)
