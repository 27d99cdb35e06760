"""What the doctor's figures say: each worker's lines from the check program (worker/doctor_check.py) in,
findings out, each one line that names a host, a chip, a link or a port and the fix.

Pure (no I/O), so every judgement is tested without a pod. The judgements, in the order they are made:

- a worker that could not run the check (unreachable, no JAX, it failed): named with what it said;
- a host that exposes fewer chips than the node's shape promises (or than its peers);
- a chip whose matmul or HBM pattern came back wrong;
- a collective some workers entered and others never reached, when the check stopped for lack of progress:
  the ones that never reached it are named;
- speed, by bisection over the per-host timings. Hosts first: a host whose own work (its chips' checks,
  every repetition, timed whole so that a host stopped in bursts shows) took SLOW_FACTOR times the median
  host's and SLOW_FLOOR_S more is slow. Then the groups the all-reduce was split into, halving down to two
  hosts: a group SLOW_FACTOR times slower than the fastest group of its size (and, where nothing is priced,
  SLOW_FLOOR_S more) with no slow host in it, and no slower group inside it, names its hosts' links (two
  hosts: the link between them);
- on a TPU, each ring against what the chips' interconnect should give (expected.py, from the planner's
  figures): RING_TOLERANCE times the high end of its estimate is slow; between slices the same with the data
  center network's figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SLOW_FACTOR = 2.0  # a host or group this many times the reference is slow ...
SLOW_FLOOR_S = 1.0  # ... and at least this many seconds slower (a loaded machine's jitter is not a fault)
RING_TOLERANCE = 4.0  # a ring or transfer slower than this many times its estimate's high end is slow


@dataclass
class WorkerFigures:
    """Everything one worker's check printed, by phase, and how its program ended."""

    worker: int
    slice: int = 0
    devices: dict[str, Any] | None = None
    chips: list[dict[str, Any]] = field(default_factory=list)
    collectives: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> its figure
    entered: list[str] = field(default_factory=list)
    done: dict[str, Any] | None = None
    error: str | None = None  # why it did not run to its end (unreachable, no JAX, its last words)
    stopped: bool = False  # the console stopped it (no progress, or the deadline)

    def add(self, record: Mapping[str, Any]) -> None:
        """One `doctor {json}` line's object."""
        phase = record.get("phase")
        if phase == "devices":
            self.devices = dict(record)
        elif phase == "chip":
            self.chips.append(dict(record))
        elif phase == "enter":
            self.entered.append(str(record.get("name")))
        elif phase in ("ring", "group", "dcn"):
            self.collectives[str(record.get("name"))] = dict(record)
        elif phase == "done":
            self.done = dict(record)
        elif phase == "error":
            self.error = str(record.get("error"))

    @property
    def local_s(self) -> float | None:
        """The host's own work: from its devices line to its last chip's figure (every repetition)."""
        if self.devices is None or not self.chips:
            return None
        return float(self.chips[-1]["t"]) - float(self.devices["t"])

    def to_json(self) -> dict[str, Any]:
        return {"worker": self.worker, "slice": self.slice, "devices": self.devices, "chips": self.chips,
                "local_s": self.local_s, "collectives": self.collectives, "entered": self.entered,
                "done": self.done, "error": self.error, "stopped": self.stopped}


@dataclass(frozen=True)
class Finding:
    kind: str  # unreachable, error, devices, chip, collective, host, link, ring, dcn, port
    workers: tuple[int, ...]
    line: str  # what is wrong, where, and the fix, in one line
    chip: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "workers": list(self.workers), "chip": self.chip, "line": self.line}


@dataclass(frozen=True)
class Expected:
    """What the interconnect should give, per collective name (expected.py): seconds, high end."""

    seconds: Mapping[str, float] = field(default_factory=dict)
    source: str = ""  # "v6e ICI 800 GB/s per chip" or why there is none


@dataclass(frozen=True)
class Pod:
    """What the judgements need of the node: its name, shape and how to name its workers."""

    name: str
    devices_per_worker: int
    slices: int = 1
    provider: str = "local"

    def worker(self, index: int, slice_of: Mapping[int, int] | None = None) -> str:
        if self.slices > 1 and slice_of is not None and index in slice_of:
            return f"worker {index} (slice {slice_of[index]})"
        return f"worker {index}"

    @property
    def recreate(self) -> str:
        return f"recreate the node (`tpu-console delete {self.name} --yes`, then create it again)"


def judge(pod: Pod, figures: Sequence[WorkerFigures], expected: Expected = Expected()) -> list[Finding]:
    """Every finding, most basic first (a host that did not run comes before a slow ring)."""
    slice_of = {f.worker: f.slice for f in figures}
    name = lambda w: pod.worker(w, slice_of)  # noqa: E731 - one short naming rule, used throughout
    findings = failed_workers(pod, figures, name)
    findings += fewer_devices(pod, figures, name)
    findings += wrong_chips(pod, figures, name)
    findings += never_entered(pod, figures, name)
    if any(f.kind in ("unreachable", "error", "devices", "collective") for f in findings):
        return findings  # the timings of a check that did not run whole name nobody
    # the groups' floor: a loaded machine's jitter where nothing is priced (CPU devices); none on a TPU, whose
    # all-reduces take milliseconds
    findings += slow_hosts_and_links(pod, figures, name, 0.0 if expected.seconds else SLOW_FLOOR_S)
    findings += slow_rings(pod, figures, expected, name)
    return findings


def failed_workers(pod: Pod, figures: Sequence[WorkerFigures], name) -> list[Finding]:
    out = []
    for f in figures:
        if f.error is None or f.stopped:
            continue
        kind = "unreachable" if f.error.startswith("unreachable") else "error"
        fix = (f"check the node with `tpu-console ls`, or {pod.recreate}" if kind == "unreachable"
               else f"see the worker's environment (`tpu-console exec {pod.name} --worker {f.worker} "
                    f"-- ...`), or {pod.recreate}")
        out.append(Finding(kind, (f.worker,), f"{name(f.worker)} of {pod.name!r} could not run the check: "
                                              f"{f.error}; {fix}"))
    return out


def fewer_devices(pod: Pod, figures: Sequence[WorkerFigures], name) -> list[Finding]:
    counts = {f.worker: int(f.devices["local"]) for f in figures if f.devices is not None}
    if not counts:
        return []
    usual = max(pod.devices_per_worker, statistics.mode(counts.values()))
    return [Finding("devices", (w,), f"{name(w)} of {pod.name!r} exposes {n} chip(s) where the node's shape "
                                     f"and its peers have {usual}: {pod.recreate}, or report the host")
            for w, n in sorted(counts.items()) if n < usual]


def wrong_chips(pod: Pod, figures: Sequence[WorkerFigures], name) -> list[Finding]:
    out = []
    for f in figures:
        for chip in f.chips:
            what = []
            if not chip.get("matmul_ok", True):
                what.append(f"a matmul with {chip.get('matmul_wrong_entries')} wrong entr(ies) (checksum "
                            f"{chip.get('matmul_checksum')}, want {chip.get('matmul_want')})")
            if not chip.get("hbm_ok", True):
                what.append(f"an HBM pattern read back with {chip.get('hbm_bad_words')} wrong word(s)")
            if what:
                out.append(Finding("chip", (f.worker,), f"{name(f.worker)} chip {chip['chip']} of "
                                   f"{pod.name!r} returned {' and '.join(what)}: report the host, and "
                                   f"{pod.recreate}",
                                   chip=int(chip["chip"])))
    return out


def never_entered(pod: Pod, figures: Sequence[WorkerFigures], name) -> list[Finding]:
    """When the check stopped for lack of progress: the first collective some entered and others did not."""
    if not any(f.stopped for f in figures):
        return []
    order: list[str] = []
    for f in figures:
        order += [n for n in f.entered if n not in order]
    for collective in order:
        inside = [f.worker for f in figures if collective in f.entered]
        away = [f.worker for f in figures if collective not in f.entered]
        if inside and away:
            waiting = _workers(inside)
            return [Finding("collective", tuple(away), f"{_names(away, name)} of {pod.name!r} never "
                            f"reached the all-reduce {collective} that workers {waiting} wait in: report "
                            f"the host, and {pod.recreate}")]
    return []


def slow_hosts_and_links(pod: Pod, figures: Sequence[WorkerFigures], name,
                         group_floor_s: float = SLOW_FLOOR_S) -> list[Finding]:
    """The bisection: hosts by their own work, then the halving groups of the all-reduce."""
    local = {f.worker: f.local_s for f in figures if f.local_s is not None}
    if len(local) < 2:
        return []
    median = statistics.median(local.values())
    slow = sorted(w for w, s in local.items() if _slow(s, median))
    out = [Finding("host", (w,), f"{name(w)} of {pod.name!r} is slow: its own chips' checks took "
                   f"{local[w]:.2f}s where the median host took {median:.2f}s: report the host, and "
                   f"{pod.recreate}") for w in slow]
    groups = _group_times(figures)
    found: list[tuple[int, ...]] = []
    for size in sorted(groups):  # smallest first: a slow pair is named before the half that holds it
        if size < 2 or len(groups[size]) < 2:
            continue
        fastest = min(groups[size].values())
        for members, seconds in sorted(groups[size].items()):
            if (_slow(seconds, fastest, group_floor_s) and not set(members) & set(slow)
                    and not any(set(inner) <= set(members) for inner in found)):
                found.append(members)
                between = (f"the link between {name(members[0])} and {name(members[1])}" if len(members) == 2
                           else f"the links among workers {_workers(list(members))}")
                out.append(Finding("link", members, f"{between} of {pod.name!r} is slow: their all-reduce "
                                   f"took {seconds:.3f}s where the fastest group of {size} took "
                                   f"{fastest:.3f}s: report the hosts, and {pod.recreate}"))
    return out


def slow_rings(pod: Pod, figures: Sequence[WorkerFigures], expected: Expected, name) -> list[Finding]:
    """Rings and transfers against the interconnect's estimate (TPU only: `expected` is empty elsewhere)."""
    out = []
    for collective, want in sorted(expected.seconds.items()):
        times = {f.worker: float(f.collectives[collective]["seconds"]) for f in figures
                 if collective in f.collectives}
        if not times:
            continue
        worst = max(times, key=times.__getitem__)
        if times[worst] > RING_TOLERANCE * want:
            kind = "dcn" if collective.startswith("dcn:") else "ring"
            where = (f"the transfer between slices {collective.partition(':')[2]} apart" if kind == "dcn"
                     else f"the all-reduce along the mesh's {collective.partition(':')[2]} axis")
            out.append(Finding(kind, (worst,), f"{where} on {pod.name!r} took {times[worst] * 1e3:.2f} ms on "
                               f"{name(worst)} where {expected.source} gives at most {want * 1e3:.2f} ms: "
                               f"report the host, and {pod.recreate}"))
    return out


def _group_times(figures: Sequence[WorkerFigures]) -> dict[int, dict[tuple[int, ...], float]]:
    """size -> members -> the slowest member's time, from every `group:N` figure."""
    members: dict[tuple[int, int, int], list[tuple[int, float]]] = {}
    for f in figures:
        for figure in f.collectives.values():
            if figure.get("phase") == "group":
                key = (int(figure["size"]), f.slice, int(figure["group_index"]))
                members.setdefault(key, []).append((f.worker, float(figure["seconds"])))
    out: dict[int, dict[tuple[int, ...], float]] = {}
    for (size, _, _), found in members.items():
        out.setdefault(size, {})[tuple(sorted(w for w, _ in found))] = max(s for _, s in found)
    return out


def _slow(seconds: float, reference: float, floor_s: float = SLOW_FLOOR_S) -> bool:
    return seconds >= SLOW_FACTOR * reference and seconds - reference >= floor_s


def _names(workers: Sequence[int], name) -> str:
    return name(workers[0]) if len(workers) == 1 else f"workers {_workers(list(workers))}"


def _workers(workers: list[int]) -> str:
    return ",".join(str(w) for w in sorted(workers))
