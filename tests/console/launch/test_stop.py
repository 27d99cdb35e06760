"""Stopping a run frees the node's launch lock where the run holds it: worker 0, or, for a run launched on
the slices left of a multislice, the first host of the first of them, also once the lost slice is back
(worker 0 READY again, but not where this run's lock is)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.console.launch.test_local import worker_home
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.domain import AcceleratorShape, CreateRequest, Node, NodeState
from tpu_console.launch import lock as launch_lock
from tpu_console.launch.job_spec import JobSpec
from tpu_console.launch.start import launch
from tpu_console.launch.stop import stop
from tpu_console.providers.local.provider import LocalProvider

pytestmark = pytest.mark.usefixtures("console_home")


def test_a_run_may_hold_the_lock_on_the_first_host_of_any_slice():
    ready, lost = str(NodeState.READY), str(NodeState.PREEMPTED)
    node = Node("ms", "gcp", AcceleratorShape("v6e-16", 6, 4, 24), NodeState.PREEMPTED, slices=3,
                slice_states=(lost, ready, ready))
    assert launch_lock.lock_worker(node) == 2  # where a launch on the slices left meets
    assert launch_lock.lock_places(node) == (0, 2, 4)
    single = Node("one", "gcp", AcceleratorShape("v6e-16", 4, 4, 16), NodeState.READY)
    assert launch_lock.lock_places(single) == (0,)


async def test_stopping_a_run_on_the_slice_left_frees_the_lock_on_that_slice():
    provider = LocalProvider()
    providers = {"local": provider}
    sleeper = JobSpec(command=[sys.executable, "-c", "import time; time.sleep(120)"], elastic=True)
    try:
        await provider.create(CreateRequest(name="ms", accelerator_type="local-1x1", slices=2))
        await provider.ssh_targets(await provider.get("ms"))  # its hosts up, as before any preemption
        await provider.preempt("ms", slice_index=0)
        result = await launch(providers, "ms", job=sleeper, slices=[1])
        assert result.ok and result.workers == [1]
        lock = worker_home(1, "ms") / launch_lock.LOCK_DIR
        assert json.loads((lock / launch_lock.OWNER_FILE).read_text())["run_id"] == result.run_id
        await provider.recreate_slice("ms", 0)
        _, stops = await stop(providers, result.run_id, grace_s=2.0)
        assert [(s.worker, s.outcome) for s in stops] == [(1, "stopped")]
        assert not lock.exists()
    finally:
        await provider.close()
