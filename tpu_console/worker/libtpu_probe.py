"""Runs on a worker (`python -m tpu_console.worker.libtpu_probe`): libtpu's runtime metrics for every local
TPU device, read from its gRPC service (localhost:8431, the interface the `tpu-info` tool uses), printed as
one JSON line. Never imports JAX: that would take the TPU from the running job. A worker where nothing
serves the metrics (a CPU pod, no job holding the TPU) answers `{"error": ...}`, never made-up numbers.

    {"devices": [{"device": 0, "hbm_used_bytes": ..., "hbm_total_bytes": ..., "duty_cycle_pct": ...,
                  "idle_s": ...}, ...]}

`idle_s` (how long the chip's TensorCore has run no program) is read where libtpu serves it, else null.
"""

from __future__ import annotations

import argparse
import json
import sys

HBM_TOTAL = "tpu.runtime.hbm.memory.total.bytes"
HBM_USAGE = "tpu.runtime.hbm.memory.usage.bytes"
DUTY_CYCLE = "tpu.runtime.tensorcore.dutycycle.percent"
IDLE = "tpu.runtime.tensorcore.idle_duration.seconds"  # newer libtpu only
DEFAULT_ADDRESS = "localhost:8431"


def read(address: str, timeout_s: float) -> dict:
    try:
        import grpc
        from tpu_info.proto import tpu_metric_service_pb2 as metrics
        from tpu_info.proto import tpu_metric_service_pb2_grpc as metrics_grpc
    except ImportError as exc:
        return {"error": f"cannot read libtpu metrics here ({exc.name} is not installed; run bootstrap)"}
    channel = grpc.secure_channel(address, grpc.local_channel_credentials())
    client = metrics_grpc.RuntimeMetricServiceStub(channel)

    def by_device(name: str) -> dict[int, float]:
        answer = client.GetRuntimeMetric(metrics.MetricRequest(metric_name=name), timeout=timeout_s)
        values = {}
        for metric in answer.metric.metrics:
            gauge = metric.gauge
            values[metric.attribute.value.int_attr] = (
                gauge.as_double if gauge.HasField("as_double") else gauge.as_int
            )
        return values

    def optional(name: str) -> dict[int, float]:
        try:
            return by_device(name)
        except grpc.RpcError:
            return {}

    try:
        total, used, duty = by_device(HBM_TOTAL), by_device(HBM_USAGE), by_device(DUTY_CYCLE)
        idle = optional(IDLE)
    except grpc.RpcError as exc:
        return {
            "error": f"no libtpu metrics at {address} ({exc.code().name.lower()}): no TPU job running, "
            "or not a TPU VM"
        }
    finally:
        channel.close()
    # Duty cycle is per chip, memory per device (core): on two-core chips, chip i covers devices 2i, 2i+1.
    per_chip = max(1, len(used) // max(1, len(duty)))
    return {
        "devices": [
            {
                "device": d,
                "hbm_used_bytes": used[d],
                "hbm_total_bytes": total.get(d),
                "duty_cycle_pct": duty.get(d // per_chip),
                "idle_s": idle.get(d // per_chip),
            }
            for d in sorted(used)
        ]
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="libtpu runtime metrics of this worker, as one JSON line")
    parser.add_argument("--address", default=DEFAULT_ADDRESS)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    print(json.dumps(read(args.address, args.timeout)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
