"""One first failure, whoever asks: `status` (again and again, after the history holds the run's end),
`runs show`, `logs --follow` and the app's watch name the same worker, the one whose job exited first
(runs.monitor.RunMonitor.first_failure: the earliest exit file, ties by worker index)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.console.launch.new_user_job import launch_new_user_job
from tests.console.launch.test_launch_command import follow
from tests.console.launch.test_local import pod, run  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.history.store import RunStore
from tpu_console.observe.watch import RunWatch
from tpu_console.providers.registry import build_providers, close_providers
from tpu_console.settings import load_settings

pytestmark = pytest.mark.usefixtures("console_home", "pod")


def test_status_runs_show_and_the_apps_watch_name_the_same_first_failure(capsys, tmp_path):
    # worker 1 fails at once, worker 0 a second later: worker 1 failed first
    run_id = launch_new_user_job(capsys, tmp_path, 3, "0=1.0", "1=0")
    status, _ = follow(capsys, run_id)
    assert status == 1
    said = []
    for _ in range(2):  # the second reads the workers' ends from the history the first one wrote
        status, out, _ = run(capsys, "status", run_id, "--json")
        said.append(json.loads(out)["failure"])
        status, out, _ = run(capsys, "status", run_id)
        said.append(next(line for line in out.splitlines() if line.startswith("failed first: ")))
    status, out, _ = run(capsys, "runs", "show", run_id, "--json")
    said.append(json.loads(out)["failure"])
    said.append(RunStore().get(run_id).failure)

    async def apps_watch() -> tuple[int | None, str | None]:  # what the dashboard's RunFeed is given
        providers = build_providers(load_settings())
        try:
            async with RunWatch.open(providers, run_id) as watch:
                health = await watch.run()
        finally:
            await close_providers(providers)
        return health.first_failure, health.failure

    first, failure = asyncio.run(apps_watch())
    assert first == 1 and failure.startswith("worker 1 exited 1")
    assert said[1] == f"failed first: {failure}"
    assert all(text is not None and "worker 1 exited 1" in text for text in said), said
