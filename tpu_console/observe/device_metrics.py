"""Live device metrics of every worker, independent of the trainer: HBM in use and total, and duty cycle,
per TPU device, from libtpu's runtime metrics service on each worker (tpu_console/worker/libtpu_probe.py,
run over the worker's command channel). They show even while the trainer hangs in a collective. Where the
platform reports nothing (CPU pods) a worker says "not reported" with why, never a number."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tpu_console.domain import Node
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.run_recipes import LIBTPU_METRICS_ADDRESS, libtpu_metrics
from tpu_console.fleet.selection import parse_worker_selection
from tpu_console.providers.base import Provider
from tpu_console.provision.worker_inspection import inspect_workers, worker_python


@dataclass(frozen=True)
class DeviceMetrics:
    device: int
    hbm_used_bytes: int | None
    hbm_total_bytes: int | None
    duty_cycle_pct: float | None
    idle_s: float | None = None  # how long the chip has run no program (newer libtpu only)

    @property
    def hbm_fraction(self) -> float | None:
        if self.hbm_used_bytes is None or not self.hbm_total_bytes:
            return None
        return self.hbm_used_bytes / self.hbm_total_bytes


@dataclass
class WorkerDeviceMetrics:
    worker: int
    devices: list[DeviceMetrics] = field(default_factory=list)
    not_reported: str | None = None  # why there are no numbers


def parse(worker: int, stdout: str, error: str | None) -> WorkerDeviceMetrics:
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    try:
        answer = json.loads(line)
    except ValueError:
        return WorkerDeviceMetrics(worker, not_reported=error or f"unexpected answer: {line[:200]!r}")
    if "error" in answer:
        return WorkerDeviceMetrics(worker, not_reported=str(answer["error"]))
    devices = [
        DeviceMetrics(d["device"], d.get("hbm_used_bytes"), d.get("hbm_total_bytes"), d.get("duty_cycle_pct"),
                      d.get("idle_s"))
        for d in answer.get("devices", [])
    ]
    return WorkerDeviceMetrics(worker, devices, None if devices else "libtpu reported no devices")


async def read_device_metrics(
    fleet: Fleet,
    workers: list[int],
    python: str,
    address: str = LIBTPU_METRICS_ADDRESS,
    timeout_s: float = 15.0,
) -> list[WorkerDeviceMetrics]:
    results = await fleet.run(libtpu_metrics(python, address), workers, timeout=timeout_s)
    return [
        parse(r.worker, r.stdout, r.error or (r.stderr.strip().splitlines() or [None])[-1]) for r in results
    ]


async def read_node_metrics(
    providers: dict[str, Provider],
    node_name: str,
    workers: str = "all",
    address: str = LIBTPU_METRICS_ADDRESS,
) -> tuple[Node, list[WorkerDeviceMetrics]]:
    """`tpu-console metrics`: open the node, check the selected workers answer, and read each one's devices
    with the interpreter a launch would use there."""
    provider, node = await open_node(providers, node_name)
    selected = parse_worker_selection(workers, node.shape.workers)
    async with Fleet(await provider.ssh_targets(node)) as fleet:
        await require_all_reachable(fleet, node_name, selected, "nothing was read")
        reports = await inspect_workers(fleet, selected)
        python = worker_python(provider, reports)
        return node, await read_device_metrics(fleet, selected, python, address)
