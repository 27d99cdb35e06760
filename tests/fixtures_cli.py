"""Test doubles for the CLI and TUI tests: a provider with fixed nodes and a fixed clock."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from tpu_console.domain import AcceleratorShape, CreateRequest, Node, NodeState, SshTarget, Worker
from tpu_console.errors import AlreadyExists, NotFound, UserError
from tpu_console.providers.base import NodeListing, Progress, Provider

NOW = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)


def make_node(
    name: str,
    provider: str = "fake",
    *,
    accelerator_type: str = "v6e-16",
    workers: int = 4,
    devices: int = 4,
    state: NodeState = NodeState.READY,
    zone: str | None = "us-east5-b",
    spot: bool = True,
    age: timedelta | None = timedelta(hours=3, minutes=12),
) -> Node:
    return Node(
        name=name,
        provider=provider,
        shape=AcceleratorShape(accelerator_type, workers, devices, workers * devices),
        state=state,
        workers=tuple(Worker(i, f"10.0.0.{i + 1}") for i in range(workers)),
        zone=zone,
        spot=spot,
        created_at=NOW - age if age is not None else None,
    )


class FakeProvider(Provider):
    """Fixed nodes; counts listings; records creates and deletes."""

    name = "fake"

    def __init__(self, nodes: list[Node] | None = None, problems: list[str] | None = None) -> None:
        self.nodes = {node.name: node for node in nodes or []}
        self.problems = problems or []
        self.list_calls = 0
        self.created: list[CreateRequest] = []
        self.deleted: list[str] = []
        self.fail_listing: Exception | None = None

    async def list_nodes(self) -> NodeListing:
        self.list_calls += 1
        if self.fail_listing:
            raise self.fail_listing
        return NodeListing(nodes=list(self.nodes.values()), problems=list(self.problems))

    async def get(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise NotFound(f"no fake node {name!r}") from None

    async def create(self, request: CreateRequest, progress: Progress = lambda _: None) -> Node:
        if not request.accelerator_type.startswith("v"):
            raise UserError(f"unknown type {request.accelerator_type!r}; use v6e-8 or v6e-16")
        if request.name in self.nodes:
            raise AlreadyExists(f"{request.name!r} exists")
        progress(f"creating {request.name}")
        self.created.append(request)
        node = make_node(request.name, self.name, accelerator_type=request.accelerator_type, age=timedelta(0))
        self.nodes[request.name] = node
        return node

    async def delete(self, name: str, progress: Progress = lambda _: None) -> None:
        await self.get(name)
        progress(f"deleting {name}")
        self.deleted.append(name)
        del self.nodes[name]

    async def ssh_targets(self, node: Node) -> list[SshTarget]:
        raise UserError("the fake provider has no workers to reach")


@pytest.fixture
def console_home(tmp_path, monkeypatch):
    """An empty TPU_CONSOLE_HOME and no TPU_CONSOLE_* / gcloud project variables from the developer's
    shell."""
    for name in list(os.environ):
        if name.startswith("TPU_CONSOLE_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    home = tmp_path / "home"
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(home))
    return home



def stand_in_tiny_inputs(worker_dirs) -> None:
    """What tiny_local.yaml reads on every worker (~/tiny-qwen2, ~/gsm8k-synthetic.jsonl), as empty stand-ins
    in each worker's home: for launches of fake trainers, which read neither, past launch's check that
    they are there (launch/inputs.py)."""
    for home in worker_dirs:
        (home / "tiny-qwen2").mkdir(parents=True, exist_ok=True)
        (home / "gsm8k-synthetic.jsonl").touch()
