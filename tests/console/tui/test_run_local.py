"""The real RunScreen against a local pod running a fake trainer (a bash script given as --python): steps
arrive on every worker, exit statuses land one by one, a worker still running after another failed shows
as hung, and the run's verdict shows; libtpu's metrics come from a server of the same gRPC interface. No
fixed data here: the screen's own RunFeed reads the pod through a RunWatch."""

from __future__ import annotations

from pathlib import Path

from tests.console.observe.test_device_metrics import libtpu_server  # noqa: F401 - fixture
from tests.console.tui.test_run_screen import DashboardApp, text_of
from tests.fixtures_cli import NOW
from tpu_console import secrets
from tpu_console.history.store import RunStore
from tpu_console.launch.start import launch
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.screens.run_screen import RunScreen
from tpu_console.tui.widgets.hbm_panel import HbmPanel
from tpu_console.tui.widgets.log_pane import LogPane
from tpu_console.tui.widgets.worker_grid import WorkerGrid

CONFIG = Path(__file__).resolve().parents[3] / "trainer" / "configs" / "tiny_local.yaml"
SECRET = "hunter2-s3cr3t-do-not-leak"

# Three steps a second apart, each an events.jsonl line and a log line; worker 2 then fails with exit 3,
# worker 3 finishes last. Each prints the secret from its .env, which the dashboard must mask.
FAKE_TRAINER = """\
echo "token is $MY_SECRET"
for step in 1 2 3; do
  echo '{"t": '$(date +%s)', "kind": "step", "process": '$TRAINER_PROCESS_ID', "step": '$step', "time/train/step_s": 0.5, "time/train/rollout_generate_s": 0.3, "time/train/update_s": 0.2, "train-reward/total/mean": 0.'$step'}' >> events.jsonl
  echo "step=$step loss=0.1"
  sleep 1
done
if [ "$TRAINER_PROCESS_ID" = 2 ]; then
  echo '{"t": '$(date +%s)', "kind": "error", "process": 2, "message": "boom on 2"}' >> events.jsonl
  exit 3
fi
if [ "$TRAINER_PROCESS_ID" = 3 ]; then sleep 2; fi
echo done
"""  # noqa: E501 - an event line of the fake trainer


async def wait_until(pilot, condition, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if condition():
            return
        await pilot.pause(0.1)
    raise AssertionError("the dashboard did not get there in time")


async def test_dashboard_shows_steps_and_exit_statuses_arriving_from_a_local_pod(local_pod, tmp_path):
    python = tmp_path / "fake-python"
    python.write_text("#!/bin/bash\n" + FAKE_TRAINER)
    python.chmod(0o755)
    env_file = tmp_path / "my.env"
    env_file.write_text(f"MY_SECRET={SECRET}\n")
    # As `sync --env-file` does: the console remembers which file went to the node (its path only), so
    # every view of that node's output masks its values (`launch --env-file` remembers it too).
    secrets.remember_env_file("pod", env_file)
    providers = {"local": local_pod.provider}
    store = RunStore()
    result = await launch(
        providers, "pod", CONFIG, ["steps=3"], env_file=env_file, python=str(python), store=store
    )
    assert result.ok

    feed = RunFeed(providers, result.run_id, store, clock=lambda: NOW, poll_s=0.3)
    app = DashboardApp(None, RunScreen(providers, result.run_id, store, feed=feed))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.run_screen
        grid = screen.query_one(WorkerGrid)
        seen_exits: list[list[str]] = []
        seen_states: list[list[str]] = []

        def column(index: int) -> list[str]:
            return [str(grid.get_row_at(i)[index]) for i in range(grid.row_count)]

        def exits() -> list[str]:
            return column(4)

        def progress() -> bool:
            for seen, now in ((seen_exits, exits()), (seen_states, column(1))):
                if grid.row_count and (not seen or seen[-1] != now):
                    seen.append(now)
            return screen.snapshot is not None and screen.snapshot.ended

        await wait_until(pilot, progress)
        await pilot.pause(0.5)
        rows = [[str(cell) for cell in grid.get_row_at(i)] for i in range(grid.row_count)]
        assert [row[2] for row in rows] == ["3"] * 4  # every worker's last step arrived
        assert exits() == ["0", "0", "3", "0"]
        assert rows[2][1] == "FAILED first" and rows[2][5] == "boom on 2"
        # Exit codes landed as they came: worker 3 was still running after the others had exited, and the
        # watcher judged it hung after worker 2's failure.
        assert any(e[:3] == ["0", "0", "3"] and e[3] == "-" for e in seen_exits), seen_exits
        assert any(states[2:] == ["FAILED first", "HUNG"] for states in seen_states), seen_states
        assert screen.snapshot.state == "failed" and screen.snapshot.failure == "worker 2 exited 3: boom on 2"
        # Every step of every worker, from step 1, for the plots: not only the latest each probe saw.
        assert {w: sorted(steps) for w, steps in screen.history.by_worker.items()} == {
            w: [1, 2, 3] for w in range(4)
        }

        await wait_until(pilot, lambda: "[3]  done" in screen.query_one(LogPane).visible_text())
        lines = screen.query_one(LogPane).visible_text()
        for worker in range(4):
            assert f"[{worker}]  token is ***" in lines
            assert f"[{worker}]  step=3 loss=0.1" in lines
        assert not any(SECRET in line for line in lines)


BURST_TRAINER = """\
for step in 1 2 3 4 5; do
  echo '{"t": 1, "kind": "step", "process": '$TRAINER_PROCESS_ID', "step": '$step', "time/train/step_s": 0.5}' >> events.jsonl
done
sleep 6
"""  # noqa: E501 - an event line of the fake trainer


async def test_the_plots_get_every_step_and_the_hbm_tab_reads_libtpu(
    local_pod,
    tmp_path,
    libtpu_server,  # noqa: F811 - the fixture imported above
):
    python = tmp_path / "fake-python"
    python.write_text("#!/bin/bash\n" + BURST_TRAINER)
    python.chmod(0o755)
    providers = {"local": local_pod.provider}
    store = RunStore()
    result = await launch(providers, "pod", CONFIG, ["steps=5"], python=str(python), store=store)
    assert result.ok
    feed = RunFeed(
        providers,
        result.run_id,
        store,
        clock=lambda: NOW,
        poll_s=0.3,
        metrics_address=libtpu_server,
        devices_every_s=0.5,
    )
    app = DashboardApp(None, RunScreen(providers, result.run_id, store, feed=feed))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.run_screen
        await pilot.press("m")  # libtpu is read while the HBM tab is shown, through the watch's connections
        await wait_until(pilot, lambda: screen.devices is not None and len(screen.devices.by_worker) == 4)
        assert [len(m.devices) for m in screen.devices.by_worker.values()] == [4] * 4
        # The fullest device of each worker (device 1: 15 of 16 GiB), beside the trainer's "not reported".
        assert text_of(screen.query_one(HbmPanel)).count("15.0/16.0G") == 4
        await wait_until(pilot, lambda: screen.snapshot is not None and screen.snapshot.ended)
        await pilot.pause(0.3)
        # Five steps land at once: every one reaches the plots (the watch reads events.jsonl whole).
        assert {w: sorted(s) for w, s in screen.history.by_worker.items()} == {
            w: [1, 2, 3, 4, 5] for w in range(4)
        }
