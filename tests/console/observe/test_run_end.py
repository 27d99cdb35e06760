"""A run that has ended is archived once and whole, however many look at its end at the same moment: the
dashboard's watch and its one-shot look in one process (which once failed the dashboard with a
`.part -> output.log` rename), and two processes (the app and `status` in another terminal); what a copy
killed half-way left goes with the next; and a run whose archive cannot be written still shows its end."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from tests.console.launch.test_local import fake_trainer, launch, pod, run_folder  # noqa: F401 - fixture
from tests.fixtures_cli import console_home  # noqa: F401 - fixture
from tests.processes import wait_for
from tpu_console.history.archive import archive_run
from tpu_console.history.store import RunStore
from tpu_console.observe.reach import reach_node
from tpu_console.observe.run_end import keep_run_end
from tpu_console.providers.local import LocalProvider
from tpu_console.secrets import SecretMasker
from tpu_console.tui.messages import RunFeedProblem, RunUpdated
from tpu_console.tui.run_feed import RunFeed

pytestmark = pytest.mark.usefixtures("console_home", "pod")

LINES = 3000  # enough output that each copy takes several reads, and so overlaps the other
TRAINER = f"""\
for i in $(seq 1 {LINES}); do echo "line $i of the job on worker $TRAINER_PROCESS_ID"; done
"""


def ended_run(capsys, tmp_path: Path) -> str:
    run_id = launch(capsys, fake_trainer(tmp_path, TRAINER), "--set", "steps=1")
    wait_for(lambda: all((run_folder(w, run_id) / "exit").exists() for w in (0, 1)), timeout=60)
    return run_id


def expected(worker: int) -> str:
    return "".join(f"line {i} of the job on worker {worker}\n" for i in range(1, LINES + 1))


def test_two_looks_at_a_runs_end_in_one_process_archive_it_once(capsys, tmp_path, monkeypatch):
    run_id = ended_run(capsys, tmp_path)
    store = RunStore()
    copies = []

    async def counted(*args, **kwargs):
        copies.append(args[1])
        return await archive_run(*args, **kwargs)

    monkeypatch.setattr("tpu_console.observe.run_end.archive_run", counted)

    async def both() -> None:
        provider = LocalProvider()
        try:
            async with reach_node({"local": provider}, "pod") as reach:
                record = store.get(run_id)
                await asyncio.gather(keep_run_end(reach.fleet, record, store),
                                     keep_run_end(reach.fleet, record, store))
        finally:
            await provider.close()

    asyncio.run(both())
    assert copies == [run_id]  # the second found it archived
    archive = Path(store.get(run_id).archive_path)
    for worker in (0, 1):
        assert (archive / f"worker-{worker}" / "output.log").read_text() == expected(worker)
    assert not list(archive.rglob("*.part")), "a copy's temporary file was left behind"


def test_two_copies_at_once_as_two_processes_make_both_succeed_with_the_whole_files(capsys, tmp_path):
    run_id = ended_run(capsys, tmp_path)
    dest = tmp_path / "archive"

    async def both():
        provider = LocalProvider()
        try:
            async with reach_node({"local": provider}, "pod") as reach:
                return await asyncio.gather(
                    archive_run(reach.fleet, run_id, [0, 1], SecretMasker(), dest=dest),
                    archive_run(reach.fleet, run_id, [0, 1], SecretMasker(), dest=dest),
                )
        finally:
            await provider.close()

    results = asyncio.run(both())
    assert all(result.complete for result in results), [result.problems for result in results]
    for worker in (0, 1):
        assert (dest / f"worker-{worker}" / "output.log").read_text() == expected(worker)
        assert oct((dest / f"worker-{worker}" / "output.log").stat().st_mode & 0o777) == "0o644"
    assert not list(dest.rglob("*.part"))


def test_a_run_whose_archive_fails_still_shows_its_end_on_the_dashboard(capsys, tmp_path, monkeypatch):
    run_id = ended_run(capsys, tmp_path)

    async def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tpu_console.observe.watch.keep_run_end", disk_full)
    posted = []

    async def follow() -> None:
        provider = LocalProvider()
        try:
            feed = RunFeed({"local": provider}, run_id, RunStore(), poll_s=0.1, devices_every_s=60)
            await asyncio.wait_for(feed.follow(posted.append), 60)
        finally:
            await provider.close()

    asyncio.run(follow())
    problems = [m.problem for m in posted if isinstance(m, RunFeedProblem) and m.problem]
    assert any("No space left on device" in p for p in problems), problems
    last = [m.snapshot for m in posted if isinstance(m, RunUpdated)][-1]
    assert last.ended and last.state == "succeeded"  # not left at "pending"


def test_what_a_copy_killed_half_way_left_is_removed_by_the_next(capsys, tmp_path):
    run_id = ended_run(capsys, tmp_path)
    dest = tmp_path / "archive"
    folder = dest / "worker-0"
    folder.mkdir(parents=True)
    ended = subprocess.Popen(["true"])  # a process that has ended, as a copy killed half-way has
    ended.wait()
    killed = folder / f".output.log.{ended.pid}.k1ll3d.part"
    live = folder / f".output.log.{os.getpid()}.l1v3.part"  # a copy in a live process, still writing
    for part in (killed, live):
        part.write_text("line 1 of the")

    async def copy():
        provider = LocalProvider()
        try:
            async with reach_node({"local": provider}, "pod") as reach:
                return await archive_run(reach.fleet, run_id, [0], SecretMasker(), dest=dest)
        finally:
            await provider.close()

    assert asyncio.run(copy()).complete
    assert not killed.exists() and live.exists()  # a copy still writing is left to finish
    assert (folder / "output.log").read_text() == expected(0)
