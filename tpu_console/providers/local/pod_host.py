"""Serve one local pod's workers from a process of their own: `python -m tpu_console.providers.local.pod_host
NAME`. Prints one JSON line `{"ports": [...]}` (worker order) once listening, and serves until stdin closes.

The console normally serves its pods in-process. A separate host process is for when the client side
must not share a CPU core's event loop with 64 servers: the fan-out benchmark, which times the client
the way it would meet a real pod (servers elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import sys

from tpu_console.providers.local.provider import LocalProvider


async def serve(name: str) -> None:
    provider = LocalProvider()
    node = await provider.get(name)
    targets = await provider.ssh_targets(node)
    print(json.dumps({"ports": [t.port for t in targets]}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, sys.stdin.read)  # returns when the parent closes our stdin
    finally:
        await provider.close()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tpu_console.providers.local.pod_host NODE_NAME")
    asyncio.run(serve(sys.argv[1]))


if __name__ == "__main__":
    main()
