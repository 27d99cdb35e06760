"""The gcp provider's side of the capacity record (providers/capacity.py): each create attempt opened when it
is sent, marked when its request becomes ACTIVE, closed with its outcome; spot nodes seen PREEMPTED and nodes
deleted marked on their attempt. A failure to write the record never fails a create."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime

from tpu_console.domain import CreateRequest, Node, NodeState
from tpu_console.providers import capacity
from tpu_console.providers.gcp.errors import ApiFailure, FailureKind


def capacity_outcome(failure: ApiFailure) -> str:
    """How a create's failure is recorded: for lack of capacity, of a reservation, or otherwise."""
    if failure.kind is FailureKind.CAPACITY:
        return capacity.CAPACITY
    if failure.kind is FailureKind.RESERVATION:
        return capacity.RESERVATION
    return capacity.FAILED


class CapacityRecord:
    """The open attempts of one provider, by request or node path, written through as they change."""

    def __init__(self, provider: str, project: Callable[[], str]) -> None:
        self._provider = provider
        self._project = project  # read when needed: a missing project only bites when a create is sent
        self._store: capacity.CapacityStore | None = None
        self._attempts: dict[str, capacity.Attempt] = {}  # request or node path -> its open attempt

    def store(self) -> capacity.CapacityStore | None:
        if self._store is None:
            try:
                self._store = capacity.CapacityStore()
            except sqlite3.Error:
                return None
        return self._store

    def start(self, path: str, zone: str, accelerator_type: str, request: CreateRequest, method: str) -> None:
        attempt = capacity.Attempt(
            provider=self._provider, project=self._project(), zone=zone, accelerator_type=accelerator_type,
            provisioning=request.provisioning, method=method, node=request.name,
            started_at=datetime.now(UTC))
        self._attempts[path] = attempt
        if (store := self.store()) is not None:
            try:
                store.start(attempt)
            except sqlite3.Error:
                pass

    def active(self, path: str, active_after_s: float) -> None:
        attempt = self._attempts.get(path)
        if attempt is not None and attempt.id and (store := self.store()) is not None:
            try:
                store.mark_active(attempt.id, active_after_s)
            except sqlite3.Error:
                pass

    def finish(self, path: str, outcome: str, reason: str | None, *,
               active_after_s: float | None = None, ready_after_s: float | None = None) -> None:
        attempt = self._attempts.pop(path, None)
        if attempt is not None and attempt.id and (store := self.store()) is not None:
            try:
                store.finish(attempt.id, outcome, reason, active_after_s=active_after_s,
                             ready_after_s=ready_after_s)
            except sqlite3.Error:
                pass

    def note_preempted(self, nodes: list[Node], now: datetime) -> None:
        """Spot nodes first seen PREEMPTED: when, for the preemption rate of their zone."""
        store = self.store()
        if store is None:
            return
        for node in nodes:
            if node.spot and node.state is NodeState.PREEMPTED and node.zone:
                try:
                    store.mark_preempted(self._project(), node.zone, node.name, now)
                except sqlite3.Error:
                    return

    def ended(self, node: Node) -> None:
        """The node was deleted: its attempt's end."""
        if node.zone and (store := self.store()) is not None:
            try:
                store.mark_ended(self._project(), node.zone, node.name, datetime.now(UTC))
            except sqlite3.Error:
                pass
