"""The simulated pod's CPU time, read from /proc (Linux): the pod_host processes this benchmark started and
everything under them (worker agents, their shells, forked followers, spare shells). A real pod spends it
on its own hosts; on the 2-core machine it competes with the console for the same cores, so the
benchmarks print it beside the console's own CPU, to tell whose cost grows with the pod's size."""

from __future__ import annotations

import os

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of its children it has waited for)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None  # it exited meanwhile: its time is in its parent's children's time
    fields = text[text.rfind(b")") + 2 :].split()  # after the command name, which may hold spaces
    # fields[1] is ppid; fields[11:15] utime, stime, cutime, cstime (proc(5), counted from `state`)
    return int(fields[1]), sum(int(v) for v in fields[11:15]) * _TICK_S


def pod_cpu_s(marker: bytes = b"pod_host") -> float:
    """CPU seconds so far of this process's children whose command line holds `marker`, and of all their
    living descendants."""
    me = os.getpid()
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(name)) is not None:
            parent[int(name)], cpu[int(name)] = stat
    roots = set()
    for pid, ppid in parent.items():
        if ppid == me:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker in f.read():
                        roots.add(pid)
            except OSError:
                continue
    total, inside = 0.0, {}
    for pid in cpu:
        chain, at = [], pid
        while at not in inside and at in parent and at not in roots and at != me:
            chain.append(at)
            at = parent[at]
        verdict = inside.get(at, at in roots)
        for p in chain:
            inside[p] = verdict
        if verdict or pid in roots:
            total += cpu[pid]
    return total
