"""Nodes say whose they are: the labels a console puts on what it makes (the TPU API emulator refuses a
label that breaks GCP's rules), `ls` with their owner and the --mine / --user filters, and `adopt` of a
node made elsewhere."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import argparse
import json

import pytest

from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home, make_provider  # noqa: F401 - fixtures
from tpu_console.cli import nodes
from tpu_console.domain import CreateRequest
from tpu_console.errors import UserError
from tpu_console.providers.gcp import labels

Z1 = ZONES[0]


def test_a_login_name_becomes_a_valid_label_value():
    assert labels.sanitise("Alice.Smith@Example.COM") == "alice-smith-example-com"
    assert labels.sanitise("x" * 80) == "x" * 63
    assert labels.console_marks("Bob", "Nash MHC") == {
        "created-by": "tpu-console", "tpu-console-user": "bob", "tpu-console-project": "nash-mhc"}


def _ls(**flags) -> argparse.Namespace:
    return argparse.Namespace(**{"provider": None, "json": True, "mine": False, "user": None, **flags})


async def test_nodes_and_requests_say_whose_they_are_and_ls_filters_by_owner(make_provider, emulator, capsys):
    provider = make_provider(team_project="Nash MHC")
    made = await provider.create(CreateRequest("mine-1", "v6e-8", zones=(Z1,), labels={"team": "rl"}))
    assert made.labels == {"created-by": "tpu-console", "tpu-console-user": "alice-smith",
                           "tpu-console-project": "nash-mhc", "team": "rl"}
    emulator.add_node(PROJECT, Z1, "bobs", "v6e-8", labels={"created-by": "tpu-console",
                                                           "tpu-console-user": "bob"})
    emulator.add_node(PROJECT, Z1, "by-gcloud", "v6e-8", labels={"team": "rl"})
    emulator.add_queued(PROJECT, Z1, "bobs-wait", "v6e-16", labels={"created-by": "tpu-console",
                                                                   "tpu-console-user": "bob"})
    providers = {"gcp": provider}

    assert await nodes.ls(_ls(), None, providers) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {n["name"]: n["owner"] for n in listed["nodes"]} == {
        "mine-1": "alice-smith", "bobs": "bob", "by-gcloud": None}  # made elsewhere: listed as ever
    assert [(r["name"], r["owner"]) for r in listed["requests"]] == [("bobs-wait", "bob")]

    assert await nodes.ls(_ls(mine=True), None, providers) == 0
    mine = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in mine["nodes"]] == ["mine-1"] and mine["requests"] == []
    assert await nodes.ls(_ls(user="Bob"), None, providers) == 0
    bobs = json.loads(capsys.readouterr().out)
    assert [n["name"] for n in bobs["nodes"]] == ["bobs"] and [r["name"] for r in bobs["requests"]] == [
        "bobs-wait"]

    # a user filter that matches nobody says so, naming who does own nodes here
    assert await nodes.ls(_ls(user="carol"), None, providers) == 0
    err = capsys.readouterr().err
    assert "no node or queued request of user carol" in err and "alice-smith, bob" in err

    # the text table has an OWNER column
    assert await nodes.ls(argparse.Namespace(provider=None, json=False, mine=False, user=None), None,
                          providers) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].rstrip().endswith("OWNER")
    assert next(line for line in table if line.startswith("by-gcloud")).rstrip().endswith("-")


async def test_adopt_labels_a_node_made_elsewhere_and_refuses_another_persons(
    make_provider, emulator, capsys
):
    emulator.add_node(PROJECT, Z1, "by-gcloud", "v6e-8", labels={"team": "rl"})
    emulator.add_node(PROJECT, Z1, "bobs", "v6e-8", labels={"tpu-console-user": "bob"})
    providers = {"gcp": make_provider()}

    assert await nodes.adopt(argparse.Namespace(name="by-gcloud", json=True), None, providers) == 0
    adopted = json.loads(capsys.readouterr().out)
    assert adopted["labels"] == {"team": "rl", "created-by": "tpu-console", "tpu-console-user": "alice-smith"}
    assert emulator.node_json(Z1, "by-gcloud")["labels"] == adopted["labels"]  # on the API, not only here

    with pytest.raises(UserError, match="bobs is bob's"):
        await nodes.adopt(argparse.Namespace(name="bobs", json=True), None, providers)
    assert emulator.node_json(Z1, "bobs")["labels"] == {"tpu-console-user": "bob"}
