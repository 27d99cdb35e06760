"""What the interconnect should give the doctor's collectives: the planner's own figures and formulas
(trainer/planner/tpu_specs.py, trainer/planner/estimate.py), priced at their high end.

Inside a slice, an all-reduce of `payload` bytes a chip over a group of n chips costs what
estimate.collective_seconds says for the slice's generation (ICI bandwidth per chip, hops, fixed cost).
Between slices, a transfer of `payload` bytes a chip costs the data-center network's fixed latency plus its
bytes at the chip's share of the host's NICs (tpu_specs.DCN_BANDWIDTH, the slow figure), an all-reduce
across k slices 2(k-1)/k of that. A node that is no TPU slice (a local pod's CPU devices) has no figure:
nothing is priced.
"""

from __future__ import annotations

from tpu_console.doctor.findings import Expected


def expected(accelerator_type: str, slices: int, hosts_per_slice: int, chips_per_host: int,
             payload_bytes: int) -> Expected:
    """Seconds per collective name (`ring:slice`, `ring:host`, `ring:chip`, `dcn:N`), the high end."""
    from trainer.planner.estimate import HIGH, collective_seconds
    from trainer.planner.tpu_specs import DCN_BANDWIDTH, UnknownAcceleratorType, parse_accelerator_type

    try:
        tpu = parse_accelerator_type(accelerator_type)
    except UnknownAcceleratorType:
        return Expected({}, f"no interconnect figure for {accelerator_type}")
    seconds: dict[str, float] = {}
    for axis, group in (("host", hosts_per_slice), ("chip", chips_per_host)):
        if group > 1:
            seconds[f"ring:{axis}"] = collective_seconds("all-reduce", payload_bytes, group, tpu, HIGH)
    dcn = DCN_BANDWIDTH.get(tpu.generation.name)
    if slices > 1 and dcn is not None:
        for shift in range(1, slices):
            seconds[f"dcn:{shift}"] = HIGH.dcn_fixed_s + payload_bytes / dcn.slow
        seconds["ring:slice"] = 2 * (HIGH.dcn_fixed_s + (slices - 1) / slices * payload_bytes / dcn.slow)
    g = tpu.generation
    source = f"{g.name} ICI ({g.ici_bandwidth / 1e9:g} GB/s a chip)"
    if slices > 1 and dcn is not None:
        source += f" and DCN ({dcn.slow * 8 / 1e9:g} Gbps a chip{', assumed' if dcn.assumed else ''})"
    return Expected(seconds, source)
