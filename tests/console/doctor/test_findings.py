"""The doctor's judgements as pure logic: the bisection names a slow host, else the pair of hosts whose
link is slow (never a host's group twice, never a group with a slow host in it); rings are timed against the
planner's ICI figures on a TPU and not at all on CPU devices; a check that did not run whole names nobody by
speed."""

from __future__ import annotations

from tpu_console.doctor.expected import expected
from tpu_console.doctor.findings import Expected, Pod, WorkerFigures, judge

POD = Pod("pod", devices_per_worker=2)


def worker(index: int, local_s: float = 1.0, groups: dict[int, float] | None = None, hosts: int = 4,
           rings: dict[str, float] | None = None) -> WorkerFigures:
    """A worker whose check ran whole: its own work took `local_s`; group:N took groups[N] (default 10 ms)."""
    f = WorkerFigures(index)
    f.add({"phase": "devices", "local": 2, "t": 100.0})
    f.add({"phase": "chip", "chip": 0, "matmul_ok": True, "hbm_ok": True, "t": 100.0 + local_s / 2})
    f.add({"phase": "chip", "chip": 1, "matmul_ok": True, "hbm_ok": True, "t": 100.0 + local_s})
    size = hosts
    while size >= 1:
        seconds = (groups or {}).get(size, 0.01)
        f.add({"phase": "enter", "name": f"group:{size}"})
        f.add({"phase": "group", "name": f"group:{size}", "size": size, "group_index": index // size,
               "seconds": seconds})
        size //= 2
    for name, seconds in (rings or {}).items():
        f.add({"phase": "ring", "name": name, "seconds": seconds})
    f.add({"phase": "done"})
    return f


def test_a_healthy_pod_has_no_finding():
    assert judge(POD, [worker(w, local_s=1.0 + 0.2 * w) for w in range(4)]) == []


def test_a_host_slow_at_its_own_work_is_named_and_its_groups_are_not_blamed_on_links():
    slow = {4: 5.0, 2: 5.0, 1: 5.0}
    figures = [worker(w, local_s=6.0 if w == 1 else 1.0, groups=slow if w < 2 else None) for w in range(4)]
    findings = judge(POD, figures)
    assert [(f.kind, f.workers) for f in findings] == [("host", (1,))]
    assert findings[0].line.startswith(
        "worker 1 of 'pod' is slow: its own chips' checks took 6.00s where the median host took 1.00s")


def test_the_bisection_names_the_pair_whose_link_is_slow():
    # hosts 2 and 3 are each fine alone, but their all-reduce together (and so the whole pod's) is slow
    figures = [worker(w, groups={4: 2.0, 2: 2.0} if w >= 2 else {4: 2.0}) for w in range(4)]
    findings = judge(POD, figures)
    assert [(f.kind, f.workers) for f in findings] == [("link", (2, 3))]
    assert findings[0].line.startswith("the link between worker 2 and worker 3 of 'pod' is slow: their "
                                       "all-reduce took 2.000s where the fastest group of 2 took 0.010s")


def test_jitter_below_the_floor_is_no_finding():
    figures = [worker(w, local_s=0.3 if w == 3 else 0.05) for w in range(4)]  # 6x, but only 0.25 s more
    assert judge(POD, figures) == []


def test_fewer_devices_than_the_shape_is_named_even_when_every_peer_agrees():
    figures = [worker(w) for w in range(2)]
    for f in figures:
        f.devices["local"] = 1
    findings = judge(POD, figures)
    assert [(f.kind, f.workers) for f in findings] == [("devices", (0,)), ("devices", (1,))]


def test_a_worker_that_failed_is_named_and_speed_is_not_judged():
    figures = [worker(w, local_s=9.0 if w == 0 else 1.0) for w in range(3)]
    figures.append(WorkerFigures(3, error="cannot import JAX here: No module named 'jax'"))
    findings = judge(POD, figures)
    assert [(f.kind, f.workers) for f in findings] == [("error", (3,))]
    assert "could not run the check: cannot import JAX here" in findings[0].line


def test_rings_are_timed_against_the_planners_ici_figures_on_a_tpu():
    want = expected("v6e-16", slices=1, hosts_per_slice=4, chips_per_host=4, payload_bytes=64 << 20)
    assert set(want.seconds) == {"ring:host", "ring:chip"}
    # 64 MiB all-reduced over 4 chips of a v6e: 2*(3/4)*64 MiB at its share of 800 GB/s, about a millisecond
    assert 0.5e-3 < want.seconds["ring:chip"] < 5e-3 and "v6e ICI (800 GB/s a chip)" in want.source
    pod = Pod("tpu", devices_per_worker=2)  # the figures above say 2 chips a worker
    fine = [worker(w, rings={"ring:chip": want.seconds["ring:chip"]}) for w in range(4)]
    assert judge(pod, fine, want) == []
    slow = [worker(w, rings={"ring:chip": 20 * want.seconds["ring:chip"] if w == 2 else 0.001})
            for w in range(4)]
    findings = judge(pod, slow, want)
    assert [(f.kind, f.workers) for f in findings] == [("ring", (2,))]
    assert "the all-reduce along the mesh's chip axis on 'tpu' took" in findings[0].line


def test_between_slices_the_dcn_figure_prices_each_shift():
    want = expected("v5litepod-16", slices=2, hosts_per_slice=4, chips_per_host=4, payload_bytes=1 << 20)
    assert {"dcn:1", "ring:slice"} <= set(want.seconds) and "DCN (25 Gbps a chip)" in want.source


def test_a_local_pod_has_no_interconnect_figure():
    assert expected("local-4x2", 1, 4, 2, 1 << 20) == Expected({}, "no interconnect figure for local-4x2")
