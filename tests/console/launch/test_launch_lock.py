"""The launch lock's shell, run by bash in a stand-in worker home: one of many acquirers at once takes it,
the others are told who holds it and since when; it is kept for a run, released by its own holder only,
and recognised as released once its run has ended or a launch that never started a run is too old."""

from __future__ import annotations

import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpu_console.launch import lock as launch_lock


def sh(home: Path, command: str) -> str:
    done = subprocess.run(["bash", "-c", command], env={**os.environ, "HOME": str(home)},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def owner(user: str, token: str, run_id: str | None = None) -> dict:
    return {"user": user, "host": f"{user}-laptop", "home": "h", "since": 1_700_000_000.0, "token": token,
            "run_id": run_id}


def test_of_many_acquirers_at_once_exactly_one_takes_the_lock(tmp_path):
    with ThreadPoolExecutor(8) as pool:
        outputs = list(pool.map(lambda i: sh(tmp_path, launch_lock.acquire_recipe(owner(f"u{i}", f"t{i}"))),
                                range(8)))
    holders = [launch_lock.parse_acquire(out) for out in outputs]
    assert holders.count(None) == 1
    winner = json.loads((tmp_path / launch_lock.LOCK_DIR / launch_lock.OWNER_FILE).read_text())["user"]
    refused = [h for h in holders if h is not None]
    assert {h.user for h in refused} == {winner}
    assert refused[0].describe() == f"{winner} on {winner}-laptop since 2023-11-14 22:13:20 UTC"


def test_only_its_holder_releases_it(tmp_path):
    assert launch_lock.parse_acquire(sh(tmp_path, launch_lock.acquire_recipe(owner("alice", "ta")))) is None
    sh(tmp_path, launch_lock.release_recipe(token="tb"))
    held = launch_lock.parse_acquire(sh(tmp_path, launch_lock.acquire_recipe(owner("bob", "tb"))))
    assert held.user == "alice"
    sh(tmp_path, launch_lock.release_recipe(token="ta"))
    assert launch_lock.parse_acquire(sh(tmp_path, launch_lock.acquire_recipe(owner("bob", "tb")))) is None


def test_a_lock_kept_for_a_run_holds_while_it_runs_and_is_stale_once_it_ended(tmp_path):
    run_id = "20260101-000000-abcd"
    folder = tmp_path / "tpu-console" / "runs" / run_id
    folder.mkdir(parents=True)
    job = subprocess.Popen(["sleep", "30"], start_new_session=True)  # the run's process group
    try:
        (folder / "pid").write_text(str(job.pid))
        sh(tmp_path, launch_lock.acquire_recipe(owner("alice", "ta")))
        sh(tmp_path, launch_lock.keep_recipe(owner("alice", "ta", run_id)))
        held = launch_lock.parse_acquire(sh(tmp_path, launch_lock.acquire_recipe(owner("bob", "tb"))))
        assert (held.user, held.run_id) == ("alice", run_id)
    finally:
        job.kill()
        job.wait()
    (folder / "exit").write_text("0\n")
    out = sh(tmp_path, launch_lock.acquire_recipe(owner("bob", "tb")))
    assert "@@ lock taken-over" in out and launch_lock.parse_acquire(out) is None


def test_a_launch_that_never_started_a_run_is_stale_after_a_while(tmp_path):
    sh(tmp_path, launch_lock.acquire_recipe(owner("alice", "ta")))
    assert launch_lock.parse_acquire(sh(tmp_path, launch_lock.acquire_recipe(owner("bob", "tb")))) is not None
    out = sh(tmp_path, launch_lock.acquire_recipe(owner("bob", "tb"), stale_after_s=-1))
    assert launch_lock.parse_acquire(out) is None and "taken-over" in out


def test_of_eight_launches_racing_after_a_run_ended_exactly_one_wins_in_every_trial(tmp_path):
    """The takeover of a stale lock is one act: two launches that both saw the ended run's lock cannot both
    remove it and both take it (before the guard, more than one won in most trials)."""
    run_id = "20260101-000000-abcd"
    folder = tmp_path / "tpu-console" / "runs" / run_id
    folder.mkdir(parents=True)
    (folder / "exit").write_text("0\n")  # the run that holds the lock has ended
    winners = []
    with ThreadPoolExecutor(8) as pool:
        for _ in range(50):
            sh(tmp_path, launch_lock.acquire_recipe(owner("alice", "ta")))
            sh(tmp_path, launch_lock.keep_recipe(owner("alice", "ta", run_id)))
            outputs = list(pool.map(
                lambda i: sh(tmp_path, launch_lock.acquire_recipe(owner(f"u{i}", f"t{i}"))), range(8)))
            won = [out for out in outputs if launch_lock.parse_acquire(out) is None]
            winners.append(len(won))
            holder = json.loads((tmp_path / launch_lock.LOCK_DIR / launch_lock.OWNER_FILE).read_text())
            refused = {launch_lock.parse_acquire(out).user for out in outputs if out not in won}
            assert refused <= {holder["user"]}  # the others name the one that won
            sh(tmp_path, launch_lock.release_recipe(token=holder["token"]))
    assert winners == [1] * 50


def test_a_release_of_a_lock_taken_over_by_another_launch_leaves_it(tmp_path):
    sh(tmp_path, launch_lock.acquire_recipe(owner("alice", "ta")))
    out = sh(tmp_path, launch_lock.acquire_recipe(owner("bob", "tb"), stale_after_s=-1))
    assert "taken-over" in out
    sh(tmp_path, launch_lock.release_recipe(token="ta"))  # alice's console, late, lets go of what it had
    held = launch_lock.parse_acquire(sh(tmp_path, launch_lock.acquire_recipe(owner("carol", "tc"))))
    assert held is not None and held.user == "bob"
