"""Before a job whose hosts talk to each other starts: does every worker reach the port it will need on
another worker (the JAX coordinator's on worker 0, megascale's on slice 0's coordinator)?

Nothing listens on those ports until the job runs, so a connection tried earlier would be refused whatever
the firewall says. So the check listens there itself for a few seconds (worker/port_probe.py, on the worker
that will hold the port), and meanwhile every worker tries to connect (bash's `/dev/tcp`, bounded by
`timeout`), all at once. A port already held on that worker is named as such: the job could not bind it.
`unreachable_ports` returns what failed; `problem_line` says it in one line, with the fix (the firewall
rule to add on gcp, the port to open between the hosts elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from tpu_console import worker
from tpu_console.domain import Node
from tpu_console.errors import one_line
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.program import PythonProgram
from tpu_console.fleet.results import WorkerLine

PROBE_SOURCE = worker.source("port_probe.py")
CONNECT_TIMEOUT_S = 3.0  # one try per worker and port; a firewall that drops packets shows as this timeout
READY_TIMEOUT_S = 30.0  # the listener's start, over a fresh SSH session at worst
LISTEN_SLACK_S = 60.0  # how long the listener outlives one try's timeout, at most


@dataclass(frozen=True)
class PortNeed:
    """`port` on worker `listener`, which every worker will reach at `host` once the job runs."""

    port: int
    listener: int
    host: str
    purpose: str  # whose port it is: "the JAX coordinator's", "megascale's"


@dataclass(frozen=True)
class PortProblem:
    need: PortNeed
    worker: int | None  # the worker that could not connect; None: the port could not be held on the listener
    reason: str
    in_use: bool = False  # the listener's port is held by another program


async def unreachable_ports(
    fleet: Fleet, needs: Sequence[PortNeed], workers: Sequence[int], timeout_s: float = CONNECT_TIMEOUT_S
) -> list[PortProblem]:
    """Listen on every needed port on its worker, try each from every worker in `workers`, all at once;
    what failed (empty: every worker reached every port)."""
    problems: list[PortProblem] = []
    held: list[PortNeed] = []
    by_listener: dict[int, list[PortNeed]] = {}
    for need in needs:
        by_listener.setdefault(need.listener, []).append(need)
    listeners = [_Listener(fleet, w, group, len(workers), timeout_s) for w, group in by_listener.items()]
    try:
        for listener, outcome in zip(listeners, await asyncio.gather(*(x.start() for x in listeners)),
                                     strict=True):
            problems += outcome
            held += [n for n in listener.needs if n.port in listener.listening]
        if held:
            problems += await _connect_all(fleet, held, workers, timeout_s)
    finally:  # every connection in: the probes end by themselves in a moment; else they are stopped now
        await asyncio.gather(*(x.finish(2.0 if held and not problems else 0.0) for x in listeners))
    return problems


class _Listener:
    """port_probe.py on one worker, followed until it has bound its ports (and stopped when done)."""

    def __init__(self, fleet: Fleet, worker_index: int, needs: list[PortNeed], expected: int,
                 timeout_s: float) -> None:
        self.fleet, self.worker, self.needs = fleet, worker_index, needs
        self.listening: set[int] = set()
        self.lines: dict[int, str] = {}  # port -> what the probe said of it
        self._ready = asyncio.Event()
        # long enough for a 1,024-host fan-out of connections; the console stops it once they are done
        args = (f"{timeout_s + LISTEN_SLACK_S:g}", str(expected), *(str(n.port) for n in needs))
        self._program = PythonProgram(PROBE_SOURCE, args)
        self._task: asyncio.Future | None = None

    def _on_line(self, line: WorkerLine) -> None:
        if line.stream != "stdout":
            return
        word, _, rest = line.text.partition(" ")
        port, _, why = rest.partition(" ")
        if word == "ready":
            self._ready.set()
        elif word == "listening":
            self.listening.add(int(port))
        elif word in ("in-use", "error"):
            self.lines[int(port)] = word if word == "in-use" else why

    async def start(self) -> list[PortProblem]:
        """Until the probe holds its ports: the ports it could not hold, or why it did not run."""
        self._task = asyncio.ensure_future(self.fleet.follow(self._program, self.worker, self._on_line))
        ready = asyncio.ensure_future(self._ready.wait())
        await asyncio.wait({self._task, ready}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        ready.cancel()
        if not self._ready.is_set():
            failed = self._task.exception() if self._task.done() else None
            result = self._task.result() if self._task.done() and failed is None else None
            if failed is not None:
                why = one_line(failed)
            elif result is None:
                why = f"no answer in {READY_TIMEOUT_S:g}s"
            else:
                said = result.stderr.strip().splitlines()
                why = result.error or (said[-1] if said else f"exit {result.exit_status}")
            return [PortProblem(n, None, f"the port check could not run there: {why}") for n in self.needs]
        return [PortProblem(n, None, "in use by another program" if said == "in-use" else said,
                            in_use=said == "in-use")
                for n in self.needs if (said := self.lines.get(n.port)) is not None]

    async def finish(self, wait_s: float) -> None:
        """Let the probe end by itself for up to `wait_s`, else stop it."""
        if self._task is None:
            return
        if wait_s > 0:
            await asyncio.wait({self._task}, timeout=wait_s)
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def connect_command(addresses: Sequence[tuple[str, int]], timeout_s: float) -> str:
    """bash: try every (host, port) at once, each bounded by `timeout`; prints `ok HOST PORT` or
    `fail HOST PORT WHY` for each."""
    seconds = f"{timeout_s:g}"
    probe = (
        "p() { o=$(timeout " + seconds + " bash -c 'exec 3<>\"/dev/tcp/$0/$1\"' \"$1\" \"$2\" 2>&1); r=$?; "
        'if [ $r -eq 0 ]; then echo "ok $1 $2"; '
        f'elif [ $r -eq 124 ]; then echo "fail $1 $2 timed out after {seconds}s"; '
        'else echo "fail $1 $2 $(printf %s "$o" | tail -n 1 | sed \'s/.*: //\')"; fi; }; '
    )
    tries = " ".join(f"p {shlex.quote(host.strip('[]'))} {int(port)} &" for host, port in addresses)
    return f"{probe}{tries} wait"


async def _connect_all(fleet: Fleet, needs: list[PortNeed], workers: Sequence[int],
                       timeout_s: float) -> list[PortProblem]:
    command = connect_command([(n.host, n.port) for n in needs], timeout_s)
    problems: list[PortProblem] = []
    for result in await fleet.run(command, workers, timeout=timeout_s + 30):
        said: dict[tuple[str, int], str] = {}
        for line in result.stdout.splitlines():
            parts = line.split(" ", 3)  # ok HOST PORT | fail HOST PORT WHY
            if len(parts) < 3 or parts[0] not in ("ok", "fail") or not parts[2].isdigit():
                continue
            why = "" if parts[0] == "ok" else (parts[3] if len(parts) > 3 else "failed")
            said[(parts[1], int(parts[2]))] = why
        for need in needs:
            why = said.get((need.host.strip("[]"), need.port))
            if why is None:
                why = result.error or result.stderr.strip() or "no answer"
            if why:
                problems.append(PortProblem(need, result.worker, why))
    return problems


def worker_name(node: Node, index: int) -> str:
    """`worker 5`, with its slice on a multislice node: `worker 5 (slice 1)`."""
    return f"worker {index} (slice {node.slice_of(index)})" if node.slices > 1 else f"worker {index}"


def problem_line(node: Node, problems: Sequence[PortProblem], doing: str) -> str:
    """One line for the first problem (a port held on its listener first), how many more, and the fix."""
    problems = sorted(problems, key=lambda p: (p.worker is not None, p.worker or 0))  # stable: needs' order
    first = problems[0]
    need = first.need
    at = f"tcp:{need.port} on {worker_name(node, need.listener)} of {node.name!r}, {need.purpose} port"
    others = len({p.worker for p in problems}) - 1
    more = f" (and {others} more worker(s))" if others > 0 else ""
    if first.worker is None:
        if first.in_use:
            ss = f"'ss -ltnp \"sport = :{need.port}\"'"
            see = f"tpu-console exec {node.name} --worker {need.listener} -- {ss}"
            return (f"{at}, is in use by another program (a job left from an earlier launch?): see which "
                    f"with `{see}`, stop it and launch again; {doing}")
        return f"{at}: {first.reason}; {doing}"
    ports = sorted({p.need.port for p in problems if p.worker is not None})
    return (f"{worker_name(node, first.worker)} of {node.name!r} cannot reach {need.host}:{need.port}, "
            f"{need.purpose} port on {worker_name(node, need.listener)}: {first.reason}{more}; "
            f"{firewall_fix(node, ports)}; {doing}")


def firewall_fix(node: Node, ports: Sequence[int]) -> str:
    """What lets the hosts reach each other on `ports`: on gcp, the firewall rule to add (from the node's
    own addresses); elsewhere, the ports to open."""
    allow = ",".join(f"tcp:{p}" for p in ports)
    if node.provider == "gcp":
        return (f"add a firewall rule: gcloud compute firewall-rules create tpu-console-{node.name}-ports "
                f"--network default --direction INGRESS --allow {allow} --source-ranges {_covering(node)}")
    listed = ", ".join(str(p) for p in ports)
    return f"open tcp port(s) {listed} between the pod's hosts"


def _covering(node: Node) -> str:
    """The smallest network holding every worker's internal address (what the rule lets in)."""
    addresses = [ipaddress.ip_address(w.internal_ip or w.host) for w in node.workers
                 if _is_address(w.internal_ip or w.host)]
    if not addresses:
        return "YOUR_SUBNET_RANGE"
    addresses = [a for a in addresses if a.version == addresses[0].version]
    network = ipaddress.ip_network(addresses[0])
    while not all(a in network for a in addresses):
        network = network.supernet()
    return str(network)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
