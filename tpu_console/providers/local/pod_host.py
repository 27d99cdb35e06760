"""Serve one local pod's workers from processes of their own: `python -m tpu_console.providers.local.pod_host
NAME [FIRST LAST]` serves workers FIRST to LAST-1 (all by default), prints one JSON line `{"ports": [...]}`
(worker order) once listening, and serves until stdin closes.

The console normally serves its pods in-process. Separate host processes are for when the client side
must not share a CPU core's event loop with the servers: the fan-out and monitor benchmarks, which time the
client the way it would meet a real pod (servers elsewhere). `start_pod_hosts` spreads a large pod over
several such processes (WORKERS_PER_HOST each), as a real pod has an sshd per host: one Python process
serving 1,024 servers would be the bottleneck of a 1,024-worker fan-out, a real pod has none such.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator

from tpu_console import ssh_identity
from tpu_console.providers.local.provider import LocalProvider
from tpu_console.providers.local.worker_server import WorkerServer, WorkerSpec

WORKERS_PER_HOST = 64


async def serve(name: str, first: int | None = None, last: int | None = None) -> None:
    provider = LocalProvider()
    node = await provider.get(name)
    workers = range(first or 0, node.shape.workers if last is None else last)
    authorized = ssh_identity.public_key_line()
    servers = [  # as LocalProvider serves them in-process, for this share of the workers
        WorkerServer(WorkerSpec(index=i, count=node.shape.workers, devices=node.shape.devices_per_worker,
                                home=provider.store.worker_dir(name, i),
                                host_key=provider.store.host_private_key(name, i)), authorized)
        for i in workers
    ]
    await asyncio.gather(*(server.start() for server in servers))
    print(json.dumps({"ports": [server.port for server in servers]}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, sys.stdin.read)  # returns when the parent closes our stdin
    finally:
        for server in servers:
            await server.close()


@contextlib.asynccontextmanager
async def start_pod_hosts(
    name: str, workers: int, per_host: int = WORKERS_PER_HOST
) -> AsyncIterator[list[int]]:
    """Serve the pod `name` (`workers` workers) from pod_host processes of `per_host` workers each; yields
    every worker's port, in worker order, and stops the processes on exit."""
    ssh_identity.public_key_line()  # made here once, not raced for by the processes
    hosts: list[asyncio.subprocess.Process] = []
    try:
        for first in range(0, workers, per_host):
            hosts.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tpu_console.providers.local.pod_host", name, str(first),
                str(min(workers, first + per_host)),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            ))
        ports: list[int] = []
        for host in hosts:
            assert host.stdout is not None
            line = await host.stdout.readline()
            if not line:
                raise RuntimeError(f"a pod_host process for {name} exited with status {await host.wait()}")
            ports += json.loads(line)["ports"]
        yield ports
    finally:
        for host in hosts:
            if host.stdin is not None:
                host.stdin.close()
        for host in hosts:
            await host.wait()


def main() -> None:
    if len(sys.argv) not in (2, 4):
        sys.exit("usage: python -m tpu_console.providers.local.pod_host NODE_NAME [FIRST LAST]")
    first, last = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) == 4 else (None, None)
    asyncio.run(serve(sys.argv[1], first, last))


if __name__ == "__main__":
    main()
