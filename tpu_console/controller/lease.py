"""Which controller acts: a lease object in the controller's store (store.py), taken and renewed by
compare-and-swap on its generation, so of two controllers started at once exactly one holds it.

The holder renews it every `ttl_s / 3`; each renewal is a new generation, and its `renewed_at` is the
controller's heartbeat that `controller status` and the app show. Another controller takes it over only
after watching one generation stay unchanged for `ttl_s` by its own clock (never by comparing clocks of
two machines): a controller killed, or cut off from the bucket, is replaced `ttl_s` after its last renewal.
The holder stops acting once `ttl_s * HOLD_FRACTION` has passed since its last successful renewal began,
which is before anyone could have taken over; a renewal that meets a newer generation means it has lost.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Any

from tpu_console.controller.store import Conflict, StateStore
from tpu_console.history import ownership

LEASE = "lease"
WHERE_ENV = "TPU_CONSOLE_CONTROLLER_WHERE"  # a daemon's `where`: the host's label (`--on` sets it)
TTL_S = 60.0
HOLD_FRACTION = 0.8


class Lease:
    def __init__(self, store: StateStore, ttl_s: float = TTL_S, where: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.ttl_s, self._clock = store, ttl_s, clock
        # `home`: which console home it serves from (a local pod is reachable from that one alone)
        self.holder = {"id": uuid.uuid4().hex[:12], "host": socket.gethostname(), "pid": os.getpid(),
                       "where": where or "this machine", "home": ownership.home_id()}
        self._generation = 0  # of the lease object while we hold it; 0: not held
        self._held_until = 0.0  # by our own clock
        self._watched: tuple[int, float] | None = None  # (another's generation, when we first saw it)

    @property
    def held(self) -> bool:
        return self._generation > 0 and self._clock() < self._held_until

    def acquire(self) -> bool:
        """Take or renew the lease; whether we hold it now. A failed read or write of the store is no
        answer: held stays what it was (until its time runs out)."""
        began = self._clock()
        try:
            data, generation = self.store.read(LEASE)
        except Exception:  # noqa: BLE001 - an unreadable store says nothing about who holds the lease
            return self.held
        if data is not None and data.get("holder", {}).get("id") != self.holder["id"]:
            if self._watched is None or self._watched[0] != generation:
                self._watched = (generation, began)  # someone else's, renewed since we last looked
                self._generation = 0
                return False
            if began - self._watched[1] < self.ttl_s:
                return False
        now = time.time()
        ours = data is not None and data.get("holder", {}).get("id") == self.holder["id"]
        record: dict[str, Any] = {"holder": self.holder, "renewed_at": now, "ttl_s": self.ttl_s,
                                  "acquired_at": data.get("acquired_at", now) if ours else now}
        try:
            self._generation = self.store.write(LEASE, record, generation)
        except Conflict:
            self._generation = 0
            return False
        except Exception:  # noqa: BLE001 - not written, as far as we know: held stays what it was
            return self.held
        self._watched = None
        self._held_until = began + self.ttl_s * HOLD_FRACTION
        return True

    def release(self) -> None:
        """Give the lease up at once (a clean stop), if we still hold it."""
        if self._generation:
            try:
                self.store.delete(LEASE, self._generation)
            except Conflict:
                pass
            self._generation = 0


def read_lease(store: StateStore) -> dict[str, Any] | None:
    """The lease as stored (holder, renewed_at, ttl_s), or None: for `controller status` and the app."""
    data, _ = store.read(LEASE)
    return data
