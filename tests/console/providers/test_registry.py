"""Provider registry and the pure parts of the verbs: which providers are built, which one `create` uses,
finding a node by name, and how exec results become an exit status."""

from __future__ import annotations

import pytest

from tests.fixtures_cli import FakeProvider, make_node
from tpu_console.errors import NotFound, UserError
from tpu_console.fleet.fleet import WorkerResult
from tpu_console.fleet.node_exec import ExecOutcome, command_line
from tpu_console.providers.nodes import list_nodes
from tpu_console.providers.registry import build_providers, create_provider_name, find_node, pick_provider
from tpu_console.settings import Settings


class GcpFake(FakeProvider):
    name = "gcp"


class LocalFake(FakeProvider):
    name = "local"


def test_local_only_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(tmp_path))
    assert list(build_providers(Settings())) == ["local"]


def test_local_can_be_turned_off():
    assert build_providers(Settings(local={"enabled": False})) == {}


@pytest.mark.parametrize(
    ("settings", "requested", "expected"),
    [
        (Settings(), None, "local"),
        (Settings(gcp={"project": "p"}), None, "gcp"),
        (Settings(gcp={"project": "p"}, default_provider="local"), None, "local"),
        (Settings(gcp={"project": "p"}, default_provider="local"), "gcp", "gcp"),
        (Settings(), "ssh", "ssh"),
    ],
)
def test_create_provider_precedence(settings, requested, expected):
    assert create_provider_name(settings, requested) == expected


def test_pick_provider_says_how_to_enable_it():
    with pytest.raises(UserError, match="pass --project or set `\\[gcp\\] project`"):
        pick_provider({"local": LocalFake()}, "gcp")
    with pytest.raises(UserError, match="add `\\[\\[ssh.nodes\\]\\]`"):
        pick_provider({}, "ssh")
    with pytest.raises(UserError, match="unknown provider 'aws': use one of local, ssh, gcp"):
        pick_provider({}, "aws")


async def test_find_node_across_providers():
    local = LocalFake([make_node("a", "local")])
    gcp = GcpFake([make_node("b", "gcp")])
    provider, node = await find_node({"local": local, "gcp": gcp}, "b")
    assert provider is gcp and node.name == "b"


async def test_unknown_node_points_at_ls():
    with pytest.raises(NotFound) as info:
        await find_node({"local": LocalFake()}, "ghost")
    assert str(info.value) == "unknown node 'ghost': `tpu-console ls` lists the nodes"


async def test_unknown_node_says_which_provider_could_not_be_asked():
    class Down(GcpFake):
        async def get(self, name):
            raise RuntimeError("503 unavailable")

    with pytest.raises(NotFound, match="could not ask gcp: 503 unavailable"):
        await find_node({"local": LocalFake(), "gcp": Down()}, "ghost")


async def test_same_name_in_two_providers_is_refused():
    providers = {"local": LocalFake([make_node("x", "local")]), "gcp": GcpFake([make_node("x", "gcp")])}
    with pytest.raises(UserError, match="exists in local and gcp"):
        await find_node(providers, "x")


async def test_list_nodes_merges_sorts_and_collects_problems():
    local = LocalFake([make_node("z", "local")])
    gcp = GcpFake([make_node("b", "gcp"), make_node("a", "gcp")], problems=["zone q: 503"])
    listing = await list_nodes({"local": local, "gcp": gcp})
    assert [(n.provider, n.name) for n in listing.nodes] == [("gcp", "a"), ("gcp", "b"), ("local", "z")]
    assert listing.problems == ["gcp: zone q: 503"]
    only = await list_nodes({"local": local, "gcp": gcp}, "local")
    assert [n.name for n in only.nodes] == ["z"] and gcp.list_calls == 1


def result(worker, status, error=None):
    return WorkerResult(worker, status, "", "", 0.1, error)


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        ([result(0, 0), result(1, 0)], 0),
        ([result(0, 0), result(1, 3), result(2, 5)], 3),
        ([result(0, 1), result(1, None, "timed out after 1s")], 1),
        ([result(0, 0), result(1, None, "connection lost while running: reset")], 255),
    ],
)
def test_exec_exit_status_is_the_first_failure(results, expected):
    assert ExecOutcome(make_node("n"), "true", results).exit_status == expected


def test_command_line_joining():
    assert command_line(["cd /x && ls"]) == "cd /x && ls"
    assert command_line(["python", "-c", "print(1)"]) == "python -c 'print(1)'"
    with pytest.raises(UserError, match="no command given"):
        command_line([])
