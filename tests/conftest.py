"""Fixtures every test area can use: a private TPU_CONSOLE_HOME for each test, and a running local pod."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures_cli import stand_in_tiny_inputs
from tpu_console.domain import CreateRequest, Node, SshTarget
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.local import LocalProvider
from tpu_console.providers.local.jobs import running_job_groups, stop_groups

# The `sshd` fixture: a real OpenSSH server on 127.0.0.1 (skips where sshd is not installed).
pytest_plugins = ["tests.fixtures_sshd"]


@pytest.fixture(autouse=True)
def isolated_console_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads or writes the developer's real tpu-console folder (keys, pods, database)."""
    home = tmp_path / "console-home"
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(home))
    return home


# What the planner puts in os.environ for libtpu when it compiles in the test process
# (trainer/planner/tpu_compile.py `tpu_devices`): a trainer that a later test starts would inherit
# TPU_ACCELERATOR_TYPE and take this machine for a Cloud TPU VM.
PLANNER_ENVIRONMENT = ("TPU_SKIP_MDS_QUERY", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES",
                       "ALLOW_MULTIPLE_LIBTPU_LOAD")


# As the session found them: a module-scoped fixture that plans (its setup runs before a test's own
# fixtures) must not make its values the ones later tests are given back.
PRISTINE_PLANNER_ENVIRONMENT = {key: os.environ.get(key) for key in PLANNER_ENVIRONMENT}


@pytest.fixture(autouse=True)
def planner_environment_stays_in_its_test() -> Iterator[None]:
    yield
    for key, value in PRISTINE_PLANNER_ENVIRONMENT.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@dataclass
class LocalPod:
    provider: LocalProvider
    node: Node
    targets: list[SshTarget]

    def worker_dir(self, worker: int) -> Path:
        return self.provider.store.worker_dir(self.node.name, worker)


@pytest.fixture
async def local_pod() -> AsyncIterator[LocalPod]:
    """A 4-worker local pod (2 CPU devices per worker) named `pod`, its SSH servers running."""
    provider = LocalProvider()
    node = await provider.create(CreateRequest(name="pod", accelerator_type="local-4x2"))
    targets = await provider.ssh_targets(node)
    stand_in_tiny_inputs(provider.store.worker_dir(node.name, w) for w in range(node.shape.workers))
    try:
        yield LocalPod(provider, node, targets)
    finally:
        await provider.close()
        # A test that failed half-way must not leave detached jobs running after it.
        if provider.store.node_dir(node.name).exists():
            groups = [
                pgid
                for worker in range(node.shape.workers)
                for pgid in running_job_groups(provider.store.worker_dir(node.name, worker))
            ]
            stop_groups(groups, grace_s=1.0)


@pytest.fixture
async def local_fleet(local_pod: LocalPod) -> AsyncIterator[Fleet]:
    async with Fleet(local_pod.targets) as fleet:
        yield fleet


@pytest.fixture
def planner(monkeypatch):
    """The launch form's plan, stubbed: the real one compiles with libtpu in a subprocess (tests/trainer/
    test_plan.py and tests/console/cli/test_plan.py run it). Set `planner.status` to choose the answer."""
    from tpu_console.experiments import planning

    class Stub:
        status, verdict = "unavailable", "stubbed in this test"
        calls: list = []

        async def __call__(self, config_path, overrides, tpu_type, **kwargs):
            self.calls.append((Path(config_path).name, list(overrides), tpu_type))
            data = {"peak_bytes": 10 * 2**30, "hbm_bytes": 32 * 2**30} if self.status == "fits" else None
            return planning.PlanOutcome(tpu_type, self.status, self.verdict, data)

    stub = Stub()
    monkeypatch.setattr(planning, "plan", stub)
    return stub
