"""Goodput through `runs show --json`, `runs compare` and the run dashboard's feed and header: a program that
knows nothing of tpu-console, on a local pod the CLI created (the creation recorded as provisioning), its
steps read from its output."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from tests.console.launch.test_local import pod, run  # noqa: F401 - pod is a fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tpu_console.history.store import RunStore
from tpu_console.providers.local import LocalProvider
from tpu_console.tui.run_feed import RunFeed
from tpu_console.tui.widgets.run_header import notes_text

pytestmark = pytest.mark.usefixtures("console_home", "pod")

# A slow start, then three steps of about 0.8 s (the job runner reads step lines every 0.5 s), one JSON
# object a line (the `jsonl` format); `quick`: no waiting at all.
PROGRAM = """\
import json, sys, time
quick = sys.argv[1:] == ["quick"]
time.sleep(0 if quick else 1.5)
for step in range(1, 4):
    time.sleep(0 if quick else 0.8)
    print(json.dumps({"step": step, "loss": 1.0 / step}), flush=True)
"""


def test_runs_show_splits_a_runs_time_into_goodput_and_badput(capsys, tmp_path: Path):
    program = tmp_path / "steps.py"
    program.write_text(PROGRAM)
    status, out, err = run(capsys, "launch", "pod", "--json", "--", sys.executable, str(program))
    assert status == 0, err
    run_id = json.loads(out)["run_id"]
    assert run(capsys, "logs", run_id, "--follow")[0] == 0

    status, out, err = run(capsys, "runs", "show", run_id, "--json")
    assert status == 0, err
    shown = json.loads(out)
    goodput = shown["goodput"]
    assert goodput["steps"] == 3 and goodput["restarts"] == 0 and not goodput["live"]
    parts = goodput["productive_s"] + sum(goodput["badput_s"].values())
    assert parts == pytest.approx(goodput["total_s"], abs=0.01)
    assert goodput["badput_s"]["provisioning"] > 0  # `create pod` ran just before
    assert goodput["badput_s"]["startup"] > 0.7  # the 1.5 s sleep and Python's start, less one step
    assert 1.0 < goodput["productive_s"] < 4.0  # three steps of about 0.8 s, seen within 0.5 s
    assert 0 < goodput["goodput_pct"] < 100
    assert shown["summary"]["goodput_pct"] == goodput["goodput_pct"]

    status, out, err = run(capsys, "runs", "show", run_id)
    assert status == 0, err
    assert "GOODPUT" in out and "program start-up" in out and "goodput " in out

    # The dashboard's feed reads the same events as they come: the same split, shown in the header.
    provider = LocalProvider()  # the pod the CLI made, from the same console home
    feed = RunFeed({"local": provider}, run_id, RunStore(), poll_s=0.1, devices_every_s=60)

    async def follow() -> None:
        try:
            await feed.follow(lambda message: None)
        finally:
            await provider.close()

    asyncio.run(follow())
    snapshot = feed.snapshot()
    assert snapshot.goodput is not None and snapshot.goodput.steps == 3
    # The feed takes the run's end from what it saw as it followed, which on a run of a few seconds can
    # be a fraction of a second from the archive's: the same split within two points.
    assert snapshot.goodput.to_json()["goodput_pct"] == pytest.approx(goodput["goodput_pct"], abs=2.0)
    assert snapshot.goodput.line() in notes_text(snapshot, None).plain

    status, out, err = run(capsys, "launch", "pod", "--json", "--", sys.executable, str(program), "quick")
    second = json.loads(out)["run_id"]
    assert run(capsys, "logs", second, "--follow")[0] == 0
    status, out, err = run(capsys, "runs", "compare", run_id, second, "--json")
    assert status == 0, err
    rows = {row["metric"]: row for row in json.loads(out)["rows"]}
    # the second run has no creation of its own: its provisioning is nothing
    assert rows["badput_provisioning_pct"]["values"][second] == 0
    assert rows["goodput_pct"]["values"][run_id] == goodput["goodput_pct"]
