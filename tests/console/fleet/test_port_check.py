"""The port check on a 4-worker local pod's real workers: a free port reached from every worker (on the exec
path and on the command channel) and released after; a port another program holds named as such; an
address the workers cannot reach named per worker with the fix; the one-line message and gcp's firewall
rule."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

import pytest

from tests.conftest import LocalPod
from tpu_console.domain import AcceleratorShape, Node, NodeState, Worker
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.port_check import PortNeed, PortProblem, problem_line, unreachable_ports

JAX = "the JAX coordinator's"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_port_outside_the_ephemeral_range() -> int:
    """A port free now that no outgoing connection will be given meanwhile (the kernel gives those from
    ip_local_port_range; a parallel test's SSH connection once took the one this test binds again)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for port in random.sample(range(max(1024, low - 10_000), low), 200):
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return port
    raise RuntimeError("no free port below the ephemeral range")


@pytest.mark.parametrize("channels", [False, True], ids=["exec", "channel"])
async def test_a_free_port_passes_and_a_held_one_is_named(local_pod: LocalPod, channels: bool):
    free = free_port_outside_the_ephemeral_range()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        async with Fleet(local_pod.targets, command_channels=channels) as fleet:
            if channels:
                assert await fleet.start_command_channels() == {}
            needs = [PortNeed(free, 0, "127.0.0.1", JAX), PortNeed(taken, 0, "127.0.0.1", "megascale's")]
            problems = await unreachable_ports(fleet, needs, [0, 1, 2, 3], timeout_s=2.0)
    assert problems == [PortProblem(needs[1], None, "in use by another program", in_use=True)]
    line = problem_line(local_pod.node, problems, "nothing was launched")
    assert line.startswith(f"tcp:{taken} on worker 0 of 'pod', megascale's port, is in use by another")
    with socket.socket() as again:  # the probe let go of the port the job will bind
        again.bind(("127.0.0.1", free))


async def test_an_address_the_workers_cannot_reach_is_named_per_worker(local_fleet: Fleet,
                                                                       local_pod: LocalPod):
    port = free_port()
    # 192.0.2.1 (TEST-NET-1) is never routed: each worker's try fails, refused, unreachable or timed out
    need = PortNeed(port, 0, "192.0.2.1", JAX)
    problems = await unreachable_ports(local_fleet, [need], [0, 1, 2, 3], timeout_s=1.0)
    assert [p.worker for p in problems] == [0, 1, 2, 3] and all(p.reason for p in problems)
    line = problem_line(local_pod.node, problems, "nothing was launched")
    assert line.startswith(f"worker 0 of 'pod' cannot reach 192.0.2.1:{port}, the JAX coordinator's port on "
                           f"worker 0: {problems[0].reason} (and 3 more worker(s)); open tcp port(s) {port} "
                           "between the pod's hosts; nothing was launched")


def test_on_gcp_the_fix_is_the_firewall_rule_for_the_nodes_addresses():
    node = Node("ms", "gcp", AcceleratorShape("v6e-16", 8, 4, 32), NodeState.READY, slices=2,
                workers=tuple(Worker(i, f"34.0.0.{i}", internal_ip=f"10.0.0.{i + 2}") for i in range(8)))
    jax, megascale = PortNeed(8482, 0, "10.0.0.2", JAX), PortNeed(8080, 0, "10.0.0.2", "megascale's")
    problems = [PortProblem(jax, 5, "timed out after 3s"), PortProblem(megascale, 5, "timed out after 3s"),
                PortProblem(jax, 6, "timed out after 3s")]
    assert problem_line(node, problems, "nothing was launched") == (
        "worker 5 (slice 1) of 'ms' cannot reach 10.0.0.2:8482, the JAX coordinator's port on worker 0 "
        "(slice 0): timed out after 3s (and 1 more worker(s)); add a firewall rule: gcloud compute "
        "firewall-rules create tpu-console-ms-ports --network default --direction INGRESS "
        "--allow tcp:8080,tcp:8482 --source-ranges 10.0.0.0/28; nothing was launched")
