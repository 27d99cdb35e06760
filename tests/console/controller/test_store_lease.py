"""The controller's store and lease on both back ends: a folder (local pods) and a bucket (a Cloud Storage
emulator on 127.0.0.1 that honours ifGenerationMatch): compare-and-swap refuses a stale write; of several
controllers asking for the lease at once exactly one holds it; a controller started afresh takes over only
after the holder stopped renewing for the lease's time; a failing or slow store takes nothing from anyone."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.gcs_api_emulator import GcsApiEmulator
from tpu_console.controller import store as store_module
from tpu_console.controller.lease import LEASE, Lease, read_lease
from tpu_console.controller.store import Conflict, FolderStore, GcsStore, open_store
from tpu_console.history import bucket_record
from tpu_console.settings import load_settings

BUCKET = "team-runs"


@pytest.fixture
def gcs(monkeypatch) -> Iterator[GcsApiEmulator]:
    api = GcsApiEmulator()
    monkeypatch.setenv(bucket_record.EMULATOR_ENV, api.start())
    yield api
    api.stop()


@pytest.fixture(params=["folder", "gcs"])
def store(request, tmp_path):
    if request.param == "folder":
        return FolderStore(tmp_path / "controller")
    request.getfixturevalue("gcs")
    return GcsStore(BUCKET, "lab/controller/")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_compare_and_swap_refuses_a_stale_write_and_a_second_create(store):
    assert store.read("run-a") == (None, 0)
    first = store.write("run-a", {"n": 1}, 0)
    with pytest.raises(Conflict):
        store.write("run-a", {"n": 99}, 0)  # it exists now
    second = store.write("run-a", {"n": 2}, first)
    with pytest.raises(Conflict):
        store.write("run-a", {"n": 98}, first)  # written since
    assert store.read("run-a") == ({"n": 2}, second) and second != first
    store.write("run-b", {"n": 1}, 0)
    assert store.names() == ["run-a", "run-b"]
    with pytest.raises(Conflict):
        store.delete("run-a", first)
    store.delete("run-a", second)
    assert store.names() == ["run-b"] and store.read("run-a") == (None, 0)


def test_of_eight_controllers_asking_at_once_exactly_one_holds_the_lease(store):
    for trial in range(5):
        leases = [Lease(store, ttl_s=30) for _ in range(8)]
        barrier, won = threading.Barrier(8), []

        def ask(lease: Lease, barrier: threading.Barrier = barrier, won: list[Lease] = won) -> None:
            barrier.wait()
            if lease.acquire():
                won.append(lease)

        threads = [threading.Thread(target=ask, args=(lease,)) for lease in leases]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1, trial
        assert read_lease(store)["holder"]["id"] == won[0].holder["id"]
        won[0].release()
        assert read_lease(store) is None


def test_a_controller_started_afresh_takes_over_only_after_the_holder_stopped_renewing(store):
    clock = Clock()
    holder, fresh = Lease(store, ttl_s=60, clock=clock), Lease(store, ttl_s=60, clock=clock)
    assert holder.acquire() and not fresh.acquire()
    for _ in range(4):  # the holder renews every 20 s: the newcomer never sees one generation last 60 s
        clock.now += 20
        assert holder.acquire() and not fresh.acquire()
    clock.now += 59  # the holder is gone (killed); its last generation stays
    assert not fresh.acquire()
    assert not holder.held  # and a holder that could not renew for 0.8 of the time no longer acts
    clock.now += 2
    assert fresh.acquire() and fresh.held
    assert not holder.acquire() and not holder.held  # back again, it finds itself replaced
    assert read_lease(store)["holder"]["id"] == fresh.holder["id"]


def test_a_failing_or_slow_store_takes_the_lease_from_nobody(gcs, monkeypatch):
    monkeypatch.setattr(store_module, "TIMEOUT_S", 0.5)
    store = GcsStore(BUCKET, "lab/controller/")
    clock = Clock()
    holder, other = Lease(store, ttl_s=60, clock=clock), Lease(store, ttl_s=60, clock=clock)
    assert holder.acquire()
    gcs.fail_next("get", 503, times=2)
    assert holder.acquire() and holder.held  # unread: still held, for the time it has left
    assert not other.acquire()
    gcs.delay_next("get", 2.0)
    clock.now += 10
    assert holder.acquire()  # the read timed out: still held, nothing written
    assert not other.acquire()
    clock.now += 70  # the other saw one generation for 70 s
    gcs.fail_next("upload", 503)
    assert not other.acquire() and read_lease(store)["holder"]["id"] == holder.holder["id"]
    assert other.acquire()


def test_the_store_sits_beside_the_run_records(tmp_path, monkeypatch):
    monkeypatch.setenv("TPU_CONSOLE_HOME", str(tmp_path))
    assert isinstance(open_store(load_settings({})), FolderStore)
    assert open_store(load_settings({})).place == str(tmp_path / "run-records" / "controller")
    gcs_store = open_store(load_settings({"gcp": {"bucket": "gs://team/lab"}}))
    assert isinstance(gcs_store, GcsStore) and gcs_store.place == "gs://team/lab/controller/"
    assert LEASE == "lease"
