"""The run side of a managed run, faked, for the controller's tests against the TPU API emulator: its
nodes are the emulator's (no workers), so preparing, the pod doctor's check, launching and reading a run are
stand-ins that remember on which node incarnation each was done."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from tpu_console.controller import loop, relaunch
from tpu_console.controller.observe import RunReading, StartMarks
from tpu_console.controller.state import INCARNATION_LABEL
from tpu_console.doctor import check


class FakeRuns:
    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.launched: list[tuple[str, str]] = []  # (run id, the node's incarnation label)
        self.prepared: list[str] = []
        self.checked: list[str] = []
        self.findings: list[str] = []  # what the doctor finds on the next nodes it checks, in turn
        self.state = "running"  # the run's state as read; a launch makes a running one
        self.preempted_by: float | None = None  # its supervisor passed on a preemption notice

    def install(self, monkeypatch: Any) -> None:
        monkeypatch.setattr(relaunch, "prepare", self.prepare)
        monkeypatch.setattr(relaunch, "launch_again", self.launch_again)
        monkeypatch.setattr(loop, "read_run", self.read_run)
        monkeypatch.setattr(loop, "read_start", self.read_start)
        monkeypatch.setattr(loop, "runs_since", self.runs_since)
        monkeypatch.setattr(check, "check_node", self.check_node)

    async def _incarnation(self, name: str) -> str:
        return (await self.provider.get(name)).labels.get(INCARNATION_LABEL, "0")

    async def prepare(self, providers, node, *_a, **_k) -> None:
        self.prepared.append(await self._incarnation(node))

    async def check_node(self, providers, node, **_k):
        self.checked.append(await self._incarnation(node))
        found = [self.findings.pop(0)] if self.findings else []
        return SimpleNamespace(ok=not found, lines=lambda: found or ["fine"])

    async def launch_again(self, providers, run_id, node, *_a, **_k):
        run = f"run-{len(self.launched)}"
        self.launched.append((run, await self._incarnation(node)))
        self.state, self.preempted_by = "running", None
        return SimpleNamespace(ok=True, run_id=run, starts=[])

    async def read_run(self, providers, run_id, *_a, **_k) -> RunReading:
        return RunReading(time.time(), state=self.state, last_step=10, preempted_by=self.preempted_by)

    async def read_start(self, *_a, **_k) -> StartMarks:
        return StartMarks(8, 9, time.time())

    async def runs_since(self, providers, node, since, store) -> list[str]:
        here = await self._incarnation(node)
        return [run for run, incarnation in reversed(self.launched) if incarnation == here]
