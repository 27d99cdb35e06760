"""The dashboard's notices stay few and current: one per subject (the run's state, each log signature, the
supervisor, a stop, a key's answer), three at most, and none left saying what no longer holds (a hang the
run's end settled, a stall that moved on). The run is told as snapshots, stage by stage."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from textual.message import Message

from tests.console.tui.fixtures_run_dashboard import RUN_ID
from tests.console.tui.test_run_screen import SIZE, DashboardApp
from tests.fixtures_cli import NOW
from tpu_console.tui.messages import RunSignatureFound, RunSupervisorDecided, RunUpdated
from tpu_console.tui.run_snapshot import RunSnapshot, WorkerRow


class StagedFeed:
    """Posts what the test hands it, when it hands it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue()

    async def follow(self, post) -> None:
        while True:
            post(await self.queue.get())

    async def follow_devices(self, post) -> None:
        await asyncio.Event().wait()

    async def stop_run(self) -> str:
        return f"{RUN_ID}: stopped (2 stopped)"

    async def stacks(self) -> str:
        return ""

    async def close(self) -> None:
        pass


RUNNING = RunSnapshot(RUN_ID, "pod", "running", tuple(WorkerRow(w, "running", step=3) for w in (0, 1)), NOW)
STALLED = replace(RUNNING, all_silent=True, stalled=(0, 1))
HUNG = replace(RUNNING, state="partially-dead", failure="worker 1 exited 1: boom", first_failure=1, hung=(0,))
FAILED = replace(HUNG, state="failed", hung=(), ended=True)


async def test_notices_replace_their_subjects_stay_three_at_most_and_stale_ones_go():
    feed = StagedFeed()
    app = DashboardApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        async def tell(*messages: Message) -> list[tuple[str, str]]:
            for message in messages:
                feed.queue.put_nowait(message)
                await pilot.pause(0.05)
            await pilot.pause(0.1)
            return [(n.title, n.message) for n in app._notifications]

        shown = await tell(RunUpdated(STALLED))
        assert [title for title, _ in shown] == ["run stalled"]
        shown = await tell(RunUpdated(RUNNING))  # it moved on: the stall notice is stale, taken down
        assert shown == []

        decisions = [RunSupervisorDecided([f"decision {i}"]) for i in range(4)]
        shown = await tell(*decisions)
        assert shown == [("supervisor on the pod", "decision 3")]  # the latest in place of the others

        signatures = [RunSignatureFound(1, kind, f"{kind} on worker 1")
                      for kind in ("oom", "exception", "oom")]
        shown = await tell(RunUpdated(HUNG), *signatures)
        assert len(shown) == 3  # the run hung, two log signatures (oom once); the supervisor's, oldest, gone
        assert [title for title, _ in shown] == ["run hung", "worker 1's log", "worker 1's log"]

        shown = await tell(RunUpdated(FAILED))  # the end takes the hang's place: no stale "run hung"
        assert len(shown) == 3 and ("run hung" not in [title for title, _ in shown])
        assert ("run ended", f"{RUN_ID} failed: worker 1 exited 1: boom") in shown

        await pilot.press("x")  # a key's answer: one notice, however often asked
        await pilot.press("x")
        await pilot.pause(0.1)
        answers = [n.message for n in app._notifications if "has ended already" in n.message]
        assert len(answers) == 1 and len(app._notifications) == 3

        await pilot.press("escape")  # leaving the dashboard takes its notices down
        await pilot.pause(0.1)
        assert len(app._notifications) == 0
