"""The gcp provider, unmodified, against the TPU API emulator over HTTP with anonymous credentials."""
# ruff: noqa: F811 - pytest fixtures are imported by name and then requested as arguments

from __future__ import annotations

import asyncio

import pytest

from tests.fixtures_gcp import PROJECT, ZONES, emulator, gcp_home, make_provider  # noqa: F401 - fixtures
from tests.tpu_api_emulator import fake_host_key
from tpu_console import ssh_identity
from tpu_console.domain import CreateRequest, NodeState
from tpu_console.errors import AlreadyExists, NotFound, UserError
from tpu_console.providers.gcp.node_mapping import state_hint

Z1, Z2, Z3 = ZONES


def node_path(zone: str, name: str) -> str:
    return f"projects/{PROJECT}/locations/{zone}/nodes/{name}"


# ---- list ---------------------------------------------------------------------------------------------

async def test_list_shows_every_zone_and_reports_the_one_that_fails(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "alpha", "v6e-8", labels={"team": "rl"})
    emulator.add_node(PROJECT, Z2, "beta", "v6e-16", spot=False)
    emulator.add_node(PROJECT, Z3, "gamma", "v4-16")
    emulator.add_node("other-proj", Z1, "not-mine", "v6e-8")
    emulator.fail_next("list", "PERMISSION_DENIED", "Permission 'tpu.nodes.list' denied", times=5, zone=Z3)

    listing = await make_provider().list_nodes()

    assert [n.name for n in listing.nodes] == ["alpha", "beta"]
    assert len(listing.problems) == 1 and Z3 in listing.problems[0]
    assert "permission denied" in listing.problems[0]
    alpha, beta = listing.nodes
    assert (alpha.zone, alpha.state, alpha.spot, alpha.health) == (Z1, NodeState.READY, True, "HEALTHY")
    assert (alpha.shape.workers, alpha.shape.devices_per_worker, alpha.shape.chips) == (1, 8, 8)
    assert alpha.labels == {"team": "rl"}
    assert alpha.created_at is not None and alpha.created_at.tzinfo is not None
    assert (beta.shape.workers, beta.shape.devices_per_worker, beta.spot) == (4, 4, False)
    assert [w.index for w in beta.workers] == [0, 1, 2, 3]
    assert all(w.host == w.external_ip and w.internal_ip for w in beta.workers)


async def test_list_retries_a_transient_5xx(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "alpha", "v4-16")
    emulator.fail_next("list", "UNAVAILABLE", "backend unavailable", times=2, zone=Z1)
    listing = await make_provider().list_nodes()
    assert listing.problems == []
    assert [(n.name, n.shape.workers, n.shape.devices_per_worker, n.shape.chips) for n in listing.nodes] == [
        ("alpha", 2, 4, 8)
    ]


async def test_list_without_zones_asks_every_location(emulator, make_provider):
    emulator.add_node(PROJECT, Z2, "beta", "v6e-16")
    listing = await make_provider(zones=[]).list_nodes()
    assert [(n.name, n.zone) for n in listing.nodes] == [("beta", Z2)]
    assert ("GET", f"/v2/projects/{PROJECT}/locations/-/nodes") in emulator.requests


async def test_internal_ip_setting_picks_internal_addresses(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "alpha", "v6e-16")
    node = await make_provider(internal_ip=True).get("alpha")
    assert all(w.host == w.internal_ip and w.host.startswith("10.") for w in node.workers)


async def test_get_unknown_node_is_not_found(make_provider):
    with pytest.raises(NotFound, match="no gcp node 'ghost'"):
        await make_provider().get("ghost")


# ---- create -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("second_zone_problem", ["stockout", "missing_reservation"])
async def test_create_falls_through_two_zones_without_capacity_and_succeeds_in_the_third(
    emulator, make_provider, second_zone_problem
):
    emulator.stockout(Z1)
    getattr(emulator, second_zone_problem)(Z2)
    lines: list[str] = []
    request = CreateRequest("trainer-1", "v6e-16", zones=(Z1, Z2, Z3), labels={"team": "rl"})

    node = await make_provider().create(request, lines.append)

    assert emulator.create_attempts == [Z1, Z2, Z3]
    assert (node.name, node.zone, node.state, node.spot) == ("trainer-1", Z3, NodeState.READY, True)
    assert (node.shape.workers, node.shape.devices_per_worker) == (4, 4)
    assert node.runtime_version == "v6e-ubuntu-2404"
    assert node.labels == {"created-by": "tpu-console", "tpu-console-user": "alice-smith", "team": "rl"}
    text = "\n".join(lines)
    assert f"{Z1}: no capacity, trying next zone" in text
    second_outcome = "no capacity" if second_zone_problem == "stockout" else "reservation not found"
    assert f"{Z2}: {second_outcome}, trying next zone" in text
    timeline = [line for line in lines if line.startswith(f"{Z3}: ")]
    assert any("CREATING" in line for line in timeline) and "READY" in timeline[-1]
    # The failed attempts left nothing behind.
    listing = await make_provider().list_nodes()
    assert [(n.name, n.zone) for n in listing.nodes] == [("trainer-1", Z3)]


async def test_create_stops_at_a_quota_error_without_trying_other_zones(emulator, make_provider):
    emulator.quota_exceeded(Z1)
    lines: list[str] = []
    with pytest.raises(UserError, match="quota exceeded") as caught:
        await make_provider().create(CreateRequest("trainer-1", "v6e-16", zones=(Z1, Z2)), lines.append)
    assert emulator.create_attempts == [Z1]
    assert Z1 in str(caught.value) and "request more TPU quota" in str(caught.value)
    assert "\n" not in str(caught.value)


async def test_create_stops_at_permission_denied(emulator, make_provider):
    emulator.fail_next("create", "PERMISSION_DENIED", "Permission 'tpu.nodes.create' denied", zone=Z1)
    with pytest.raises(UserError, match="permission denied.*roles/tpu.admin"):
        await make_provider().create(CreateRequest("trainer-1", "v6e-8", zones=(Z1, Z2)))
    assert emulator.create_attempts == [Z1]


async def test_create_of_an_existing_name_says_already_exists(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "trainer-1", "v6e-8")
    with pytest.raises(AlreadyExists, match="already exists"):
        await make_provider().create(CreateRequest("trainer-1", "v6e-8", zones=(Z1, Z2)))
    assert emulator.create_attempts == [Z1]


async def test_create_when_every_zone_is_out_of_capacity_names_each(emulator, make_provider):
    emulator.stockout(Z1)
    emulator.stockout(Z2)
    with pytest.raises(UserError, match=f"in any zone: {Z1} no capacity; {Z2} no capacity.*--on-demand"):
        await make_provider().create(CreateRequest("trainer-1", "v6e-16", zones=(Z1, Z2)))


async def test_create_on_demand_v4_uses_its_runtime_and_survives_a_5xx_while_waiting(emulator, make_provider):
    emulator.fail_next("get", "UNAVAILABLE", "try again", times=1, zone=Z2)
    node = await make_provider().create(CreateRequest("v4-pod", "v4-16", zones=(Z2,), spot=False))
    body = emulator.node_json(Z2, "v4-pod")
    assert body["runtimeVersion"] == "tpu-ubuntu2204-base"
    assert body["schedulingConfig"].get("spot", False) is False
    assert (node.spot, node.shape.workers, node.shape.chips) == (False, 2, 8)


async def test_create_reports_a_node_preempted_before_it_became_ready(emulator, make_provider):
    emulator.create_delay = 30  # stays CREATING until preempted below
    lines: list[str] = []
    request = CreateRequest("doomed", "v6e-8", zones=(Z1,))
    task = asyncio.create_task(make_provider().create(request, lines.append))
    for _ in range(500):  # at most ~5 s
        if any("CREATING" in line for line in lines):
            break
        await asyncio.sleep(0.01)
    emulator.preempt(Z1, "doomed", "Spot capacity was reclaimed.")
    with pytest.raises(UserError, match="doomed in .* became PREEMPTED while being created.*quota"):
        await task
    assert lines[-1].startswith(f"{Z1}: PREEMPTED (Spot capacity was reclaimed.) after ")


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (CreateRequest("Bad_Name", "v6e-8", zones=(Z1,)), "invalid node name"),
        (CreateRequest("ok", "v9x-8", zones=(Z1,)), "unknown accelerator type 'v9x-8'.*v6e"),
        (CreateRequest("ok", "v6e-8", zones=()), "no zone to create in"),
        (CreateRequest("ok", "v6e-8", zones=(Z1,), labels={"Team": "x"}), "invalid label Team=x"),
    ],
)
async def test_bad_create_requests_fail_before_any_api_call(emulator, make_provider, request_, message):
    with pytest.raises(UserError, match=message):
        await make_provider(zones=[]).create(request_)
    assert emulator.requests == []


# ---- delete and preemption ----------------------------------------------------------------------------


async def test_delete_waits_until_the_node_is_gone(emulator, make_provider):
    emulator.add_node(PROJECT, Z2, "old", "v6e-8")
    lines: list[str] = []
    provider = make_provider()
    await provider.delete("old", lines.append)
    assert ("DELETE", f"/v2/{node_path(Z2, 'old')}") in emulator.requests
    with pytest.raises(NotFound):
        await provider.get("old")
    assert "deleted" in lines[-1]


async def test_preempted_spot_node_is_shown_refused_for_ssh_and_deletable(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "spotty", "v6e-16")
    emulator.preempt(Z1, "spotty", "Spot capacity was reclaimed.")
    provider = make_provider()

    (node,) = (await provider.list_nodes()).nodes
    assert node.state is NodeState.PREEMPTED and node.state.holds_quota
    assert node.state_reason == "Spot capacity was reclaimed."
    assert "holds TPU quota until deleted" in state_hint(node)

    with pytest.raises(UserError, match="PREEMPTED, not READY.*quota"):
        await provider.ssh_targets(node)

    lines: list[str] = []
    await provider.delete("spotty", lines.append)
    assert "holds TPU quota" in lines[0]


# ---- ssh access ---------------------------------------------------------------------------------------

EXISTING_KEYS = "alice:ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAlice alice@lab\nbob:ssh-rsa AAAAB3NzaBob bob@lab"


async def test_ssh_key_is_appended_keeping_other_keys_and_retried_on_409(emulator, make_provider):
    emulator.add_node(
        PROJECT, Z1, "pod", "v6e-16", metadata={"ssh-keys": EXISTING_KEYS, "startup-script": "echo hi"}
    )
    emulator.fail_next("update", "ABORTED", "The node is being modified by another operation", times=2)
    provider = make_provider(ssh_user="root")
    node = await provider.get("pod")

    targets = await provider.ssh_targets(node)

    metadata = emulator.node_json(Z1, "pod")["metadata"]
    lines = metadata["ssh-keys"].splitlines()
    assert lines[:2] == EXISTING_KEYS.splitlines()
    assert lines[2] == f"root:{ssh_identity.public_key_line()}"
    assert metadata["startup-script"] == "echo hi"
    patches = [r for r in emulator.requests if r[0] == "PATCH"]
    assert len(patches) == 3  # two 409s, then the update that went through

    published = emulator.host_key_lines(Z1, "pod")
    assert [t.worker for t in targets] == [0, 1, 2, 3]
    assert [t.host_keys for t in targets] == [tuple(k) for k in published]
    assert all(
        t.username == "root" and t.port == 22 and t.client_key == ssh_identity.client_key_path()
        for t in targets
    )
    assert [t.host for t in targets] == [w.external_ip for w in node.workers]

    await provider.ssh_targets(node)  # the key is there now: no second update
    assert len([r for r in emulator.requests if r[0] == "PATCH"]) == 3


async def test_changed_host_key_is_refused_but_a_recreated_node_is_pinned_afresh(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "pod", "v6e-16")
    provider = make_provider()
    node = await provider.get("pod")
    await provider.ssh_targets(node)

    emulator.set_host_key(Z1, "pod", 2, fake_host_key())
    with pytest.raises(UserError, match="host key of worker 2 .* changed: pinned SHA256:"):
        await provider.ssh_targets(node)

    # Deleted and created again under the same name: a new node id, so its new keys are trusted.
    await provider.delete("pod")
    emulator.add_node(PROJECT, Z1, "pod", "v6e-16")
    targets = await provider.ssh_targets(await provider.get("pod"))
    assert [t.host_keys for t in targets] == [tuple(k) for k in emulator.host_key_lines(Z1, "pod")]


async def test_node_that_is_not_ready_is_refused(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "young", "v6e-8", state="CREATING")
    provider = make_provider()
    with pytest.raises(UserError, match="CREATING, not READY.*wait until it is READY"):
        await provider.ssh_targets(await provider.get("young"))


async def test_os_login_node_imports_the_key_instead_of_editing_metadata(emulator, make_provider):
    emulator.add_node(PROJECT, Z1, "secure", "v6e-8", metadata={"enable-oslogin": "TRUE"})
    node = await make_provider().get("secure")
    with pytest.raises(UserError, match="oslogin_user"):
        await make_provider().ssh_targets(node)

    targets = await make_provider(oslogin_user="Ada@example.com").ssh_targets(node)

    assert [t.username for t in targets] == ["ada_example_com"]
    assert emulator.oslogin_keys["Ada@example.com"] == [ssh_identity.public_key_line()]
    assert not any(r[0] == "PATCH" for r in emulator.requests)


# ---- configuration ------------------------------------------------------------------------------------


async def test_missing_project_says_how_to_set_it(gcp_home):
    from tpu_console.providers.gcp import GcpProvider
    from tpu_console.settings import load_settings

    provider = GcpProvider(load_settings({"gcp": {"zones": [Z1]}}))
    with pytest.raises(UserError, match="no GCP project: set \\[gcp\\] project"):
        await provider.list_nodes()


async def test_missing_credentials_say_how_to_log_in(gcp_home, monkeypatch):
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    from tpu_console.providers.gcp import GcpProvider
    from tpu_console.settings import load_settings

    def no_credentials(*_args, **_kwargs):
        raise DefaultCredentialsError("none")

    monkeypatch.setattr(google.auth, "default", no_credentials)
    provider = GcpProvider(load_settings({"gcp": {"project": PROJECT, "zones": [Z1]}}))
    with pytest.raises(UserError, match="gcloud auth application-default login"):
        await provider.list_nodes()
