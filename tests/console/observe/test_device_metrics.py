"""Live device metrics from libtpu's runtime-metrics gRPC service, read on every worker of a local pod: a
server of the same interface (the `tpu-info` protos) stands in for libtpu; a pod where nothing serves them
reports "not reported", never numbers."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from tpu_info.proto import tpu_metric_service_pb2 as metrics
from tpu_info.proto import tpu_metric_service_pb2_grpc as metrics_grpc

from tests.console.launch.test_local import run
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.worker.libtpu_probe import DUTY_CYCLE, HBM_TOTAL, HBM_USAGE, IDLE

pytestmark = pytest.mark.usefixtures("console_home")
GIB = 1 << 30
# Two v4-like chips of two devices each: memory per device, duty cycle per chip.
VALUES = {HBM_TOTAL: {0: 16 * GIB, 1: 16 * GIB, 2: 16 * GIB, 3: 16 * GIB},
          HBM_USAGE: {0: 3 * GIB, 1: 15 * GIB, 2: 1 * GIB, 3: 2 * GIB},
          DUTY_CYCLE: {0: 87.5, 1: 12.0},
          IDLE: {0: 0.0, 1: 412.0}}  # per chip, like the duty cycle


class FakeLibtpu(metrics_grpc.RuntimeMetricServiceServicer):
    def GetRuntimeMetric(self, request, context):
        if request.metric_name not in VALUES:
            context.abort(grpc.StatusCode.NOT_FOUND, request.metric_name)
        answer = metrics.MetricResponse()
        answer.metric.name = request.metric_name
        for device, value in VALUES[request.metric_name].items():
            metric = answer.metric.metrics.add()
            metric.attribute.key = "device-id"
            metric.attribute.value.int_attr = device
            if isinstance(value, float):
                metric.gauge.as_double = value
            else:
                metric.gauge.as_int = value
        return answer


@pytest.fixture
def libtpu_server():
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    metrics_grpc.add_RuntimeMetricServiceServicer_to_server(FakeLibtpu(), server)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server.add_secure_port(f"localhost:{port}", grpc.local_server_credentials())
    server.start()
    yield f"localhost:{port}"
    server.stop(0)


def test_every_worker_reads_hbm_and_duty_cycle_from_libtpu(capsys, libtpu_server):
    assert run(capsys, "create", "pod", "--type", "local-2x1")[0] == 0
    status, out, err = run(capsys, "metrics", "pod", "--address", libtpu_server, "--json")
    assert status == 0, err
    workers = json.loads(out)["workers"]
    assert [w["worker"] for w in workers] == [0, 1]
    for worker in workers:  # both workers share this machine, so both see the same stand-in
        assert worker["not_reported"] is None
        devices = {d["device"]: d for d in worker["devices"]}
        assert devices[1]["hbm_used_bytes"] == 15 * GIB and devices[1]["hbm_total_bytes"] == 16 * GIB
        assert [devices[d]["duty_cycle_pct"] for d in range(4)] == [87.5, 87.5, 12.0, 12.0]
        assert [devices[d]["idle_s"] for d in range(4)] == [0.0, 0.0, 412.0, 412.0]
    status, out, _ = run(capsys, "metrics", "pod", "--address", libtpu_server)
    assert "15.0/16.0 GiB (94%)" in out and "near the limit" in out and "88%" in out


def test_a_cpu_pod_reports_not_reported_never_numbers(capsys):
    assert run(capsys, "create", "pod", "--type", "local-1x2")[0] == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"localhost:{s.getsockname()[1]}"
    status, out, _ = run(capsys, "metrics", "pod", "--address", nobody, "--json")
    assert status == 0
    (worker,) = json.loads(out)["workers"]
    assert worker["devices"] == [] and "no libtpu metrics at" in worker["not_reported"]
