"""The ports a job's hosts reach each other on, checked before it starts: the JAX coordinator's on the first
worker (jax.distributed.initialize waits there for every process) and, on a multislice node, megascale's on
slice 0's coordinator. A worker that cannot reach one would hang the job at startup (JAX 0.8.1 moved the
coordinator's default port; a firewall that opened only the old one hangs every multi-host job), so
`launch` refuses with the port and the fix instead (fleet/port_check.py does the trying).
"""

from __future__ import annotations

from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.port_check import PortNeed, problem_line, unreachable_ports
from tpu_console.launch import multislice

# JAX's coordinator port where JAX finds the coordinator itself (Cloud TPU VMs): `coordinator_port` in
# jax/_src/clusters/cloud_tpu_cluster.py: 8482 in the JAX 0.10.2 of .venv and since 0.8.1, 8476 in older
# releases (a firewall opened for 8476 hangs jax.distributed.initialize on newer JAX); JAX_COORDINATOR_PORT
# overrides it (jax/_src/clusters/cluster.py).
JAX_COORDINATOR_PORT = 8482
JAX_PORT_ENV = "JAX_COORDINATOR_PORT"
# Where the console names the coordinator itself (local and ssh pods), under these names (launch.py).
COORDINATOR_NAMES = ("JAX_COORDINATOR_ADDRESS", "TRAINER_COORDINATOR_ADDRESS")


def job_ports(node: Node, env: dict[str, str], first: int, first_host: str) -> list[PortNeed]:
    """What every worker must reach, read from the first worker's job environment `env`: the coordinator
    the console names there, else JAX's own default on `first` (the first worker, at `first_host` on the
    pod's network); megascale's coordinator on a multislice node."""
    named = next((env[name] for name in COORDINATOR_NAMES if env.get(name)), None)
    if named:
        host, _, port = named.rpartition(":")
    else:
        host, port = first_host, env.get(JAX_PORT_ENV) or str(JAX_COORDINATOR_PORT)
    needs = [PortNeed(int(port), first, host, "the JAX coordinator's")]
    if node.slices > 1:  # slice 0's first host: the first worker of a multislice launch (every host runs it)
        megascale = PortNeed(int(env.get(multislice.PORT) or multislice.DEFAULT_PORT), first,
                             env.get(multislice.COORDINATOR) or first_host, "megascale's")
        if (megascale.port, megascale.host) != (needs[0].port, needs[0].host):
            needs.append(megascale)
    return needs


async def refuse_unreachable_ports(fleet: Fleet, node: Node, envs: dict[int, dict[str, str]],
                                   selected: list[int]) -> None:
    """UserError, one line naming the worker, the port and the fix, when a worker cannot reach a port the
    job will need on another; nothing for a job on one host."""
    if len(selected) < 2:
        return
    first = selected[0]
    known = next((w for w in node.workers if w.index == first), None)
    first_host = (known.internal_ip if known and known.internal_ip else fleet.targets[first].host)
    problems = await unreachable_ports(fleet, job_ports(node, envs[first], first, first_host), selected)
    if problems:
        raise UserError(problem_line(node, problems, "nothing was launched"))
