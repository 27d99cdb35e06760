"""A local pod served from pod_host processes, a share of the workers each (the benchmarks' large pods)."""

from __future__ import annotations

from tpu_console.domain import CreateRequest
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.local import LocalProvider
from tpu_console.providers.local.pod_host import start_pod_hosts


async def test_a_pod_served_by_several_pod_host_processes():
    provider = LocalProvider()
    node = await provider.create(CreateRequest(name="hosted", accelerator_type="local-3x1"))
    async with start_pod_hosts(node.name, 3, per_host=2) as ports:  # two processes: workers 0-1, then 2
        assert len(ports) == 3 and len(set(ports)) == 3
        async with Fleet(provider.targets_at(node, ports)) as fleet:
            results = await fleet.run("echo $TPU_WORKER_ID $TPU_WORKER_COUNT; pwd")
    assert [r.stdout.split("\n")[0] for r in results] == ["0 3", "1 3", "2 3"]
    assert [r.stdout.split("\n")[1] for r in results] == [
        str(provider.store.worker_dir("hosted", w)) for w in range(3)]
    await provider.delete(node.name)
