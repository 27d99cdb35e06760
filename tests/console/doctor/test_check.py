"""`check_node` on a real 4-worker local pod (2 CPU devices a worker): a healthy pod passes with every figure
per worker; each fault the doctor knows is named, with its host (and chip): a chip that answers wrong and a
worker that never enters a collective (the check program's test hook), a host exposing fewer devices, a host
stopped in bursts, a coordinator port no worker reaches. Nothing is left running on the workers."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from tests.conftest import LocalPod
from tests.console.doctor.faults import StopInBursts, block_coordinator, expose_devices
from tpu_console.doctor import check_node
from tpu_console.doctor.check import FAULT_ENV, start_command, stop_command
from tpu_console.domain import CreateRequest
from tpu_console.providers.local import LocalProvider


async def check(local_pod: LocalPod, **options):
    return await check_node({"local": local_pod.provider}, "pod", **options)


def nothing_left_running(local_pod: LocalPod, within_s: float = 5.0) -> bool:
    """No check program runs in this pod's workers' folders once `within_s` has passed (a process killed a
    moment ago may still be on its way out; another test's pod, in a parallel test process, may be running
    its own)."""
    pod_dir = str(local_pod.provider.store.node_dir("pod"))
    deadline = time.monotonic() + within_s
    while True:
        running = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if (entry.name.isdigit() and b"doctor_check.py" in (entry / "cmdline").read_bytes()
                        and os.readlink(entry / "cwd").startswith(pod_dir)):
                    running.append(entry.name)
        if not running or time.monotonic() > deadline:
            return not running
        time.sleep(0.1)


async def test_a_healthy_pod_passes_with_every_figure_per_worker(local_pod: LocalPod):
    report = await check(local_pod)
    assert report.ok and report.findings == [], report.lines()
    document = report.to_json()
    assert [w["worker"] for w in document["workers"]] == [0, 1, 2, 3]
    for w in document["workers"]:
        assert w["devices"]["local"] == 2 and w["devices"]["counts"] == {"0": 2, "1": 2, "2": 2, "3": 2}
        assert [c["chip"] for c in w["chips"]] == [0, 1]
        assert all(c["matmul_ok"] and c["hbm_ok"] and c["matmul_s"] > 0 for c in w["chips"])
        # a ring along each axis of the (host, chip) mesh, and the bisection's pairs of hosts
        assert set(w["collectives"]) == {"ring:host", "ring:chip", "group:2"}
        assert all(c["seconds"] > 0 and c["first_s"] > 0 and c["compile_s"] > 0
                   for c in w["collectives"].values())
        assert w["done"] is not None and w["local_s"] > 0
    assert document["expected"]["seconds"] == {}  # CPU devices: no interconnect figure to time against
    assert report.lines()[0].startswith("pod: 4 worker(s), 8 chip(s) answered right")
    assert nothing_left_running(local_pod)


async def test_a_chip_that_answers_wrong_is_named_with_its_host(local_pod: LocalPod, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "wrong-result:2:1")
    report = await check(local_pod)
    assert [(f.kind, f.workers, f.chip) for f in report.findings] == [("chip", (2,), 1)]
    assert report.findings[0].line.startswith("worker 2 chip 1 of 'pod' returned a matmul with 1 wrong entr")
    assert "recreate the node (`tpu-console delete pod --yes`" in report.findings[0].line


async def test_a_worker_that_never_enters_the_collective_is_named(local_pod: LocalPod, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "never-enters:3")
    report = await check(local_pod, stall_s=5.0)
    assert report.stopped == "no worker made progress for 5s"
    assert [(f.kind, f.workers) for f in report.findings] == [("collective", (3,))]
    assert report.findings[0].line.startswith(
        "worker 3 of 'pod' never reached the all-reduce ring:host that workers 0,1,2 wait in")
    assert nothing_left_running(local_pod)  # the others, stuck in the collective, were stopped


async def test_a_host_exposing_fewer_devices_is_named(local_pod: LocalPod):
    await expose_devices(local_pod.provider, "pod", 1, devices=1)
    report = await check(local_pod)
    assert [(f.kind, f.workers) for f in report.findings] == [("devices", (1,))]
    assert report.findings[0].line.startswith(
        "worker 1 of 'pod' exposes 1 chip(s) where the node's shape and its peers have 2")


async def test_a_host_stopped_in_bursts_is_named(local_pod: LocalPod):
    # stopped 0.6 s after every 20 ms of CPU: its chip checks take 2.6-3.8 s (at a load of 6) where its
    # peers' take 0.2-0.4 s, clear of the finding's floor (twice the median and 1 s more)
    with StopInBursts(local_pod.worker_dir(2)):
        report = await check(local_pod)
    assert [(f.kind, f.workers) for f in report.findings] == [("host", (2,))], report.lines()
    assert report.findings[0].line.startswith("worker 2 of 'pod' is slow: its own chips' checks took")


async def test_a_coordinator_port_no_worker_reaches_is_named_before_any_chip_is_checked(local_pod: LocalPod):
    block_coordinator(local_pod.provider, 45678)
    report = await check(local_pod)
    assert [(f.kind, f.workers) for f in report.findings] == [("port", (0,))]
    line = report.findings[0].line
    assert line.startswith("worker 0 of 'pod' cannot reach 192.0.2.1:45678, the JAX coordinator's port on "
                           "worker 0")
    assert "open tcp port(s) 45678 between the pod's hosts; the chips were not checked" in line
    assert all(w.devices is None for w in report.workers)


@pytest.mark.parametrize("python", ["python3", "~/tpu-console/env/bin/python"])
def test_the_start_and_stop_commands_quote_what_they_are_given(python):
    command = start_command("tpu-console/doctor/x y", python, ["--bytes", "1; rm"], 60)
    assert command.startswith("cd \"$HOME\"/'tpu-console/doctor/x y' || exit 3; echo $$ > pid; exec timeout "
                              "-s KILL 60 ")
    assert "'--bytes' '1; rm'" in command or "--bytes '1; rm'" in command
    assert stop_command("tpu-console/doctor/x y") == (
        "p=$(cat \"$HOME\"/'tpu-console/doctor/x y'/pid 2>/dev/null) && kill -KILL -- \"-$p\" 2>/dev/null; "
        "true")


async def test_a_multislice_node_gets_transfers_between_its_slices_and_names_workers_by_slice(monkeypatch):
    provider = LocalProvider()
    try:
        node = await provider.create(CreateRequest(name="ms", accelerator_type="local-2x1", slices=2))
        await provider.ssh_targets(node)
        report = await check_node({"local": provider}, "ms")
        assert report.ok, report.lines()
        for w in report.workers:
            assert w.slice == w.worker // 2
            # the all-reduce across slices and a slice's hosts, the halving groups, one shift between slices
            assert set(w.collectives) == {"ring:slice", "ring:host", "group:2", "dcn:1"}
        monkeypatch.setenv(FAULT_ENV, "wrong-result:3:0")
        report = await check_node({"local": provider}, "ms")
        named = [f.line.split(" returned")[0] for f in report.findings]
        assert named == ["worker 3 (slice 1) chip 0 of 'ms'"]
    finally:
        await provider.close()


def test_the_bisection_groups_are_the_sizes_it_can_compare():
    from tpu_console.worker.doctor_check import group_sizes

    # one group of every host is ring:host, one host alone ring:chip: neither is compared with anything
    assert group_sizes(256, 1) == [128, 64, 32, 16, 8, 4, 2]
    assert group_sizes(6, 1) == [3] and group_sizes(2, 1) == [] and group_sizes(1, 1) == []
    assert group_sizes(2, 2) == [2]  # each slice's hosts, against the other slice's
