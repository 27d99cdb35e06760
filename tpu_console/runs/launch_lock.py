"""Launching is exclusive across consoles: an atomic lock on the pod (`mkdir ~/tpu-console/launch.lock`
on the run's first worker, with `owner.json` saying who holds it, from where, since when and, once the
job started, for which run). Of two launches at once on one node exactly one takes it; the other is
refused naming the holder.

The lock is released when a launch fails, when its run is stopped, and is recognised as released once
its run has ended (no live process group, or an `exit` file) or, for a launch that never got as far as a
run (its console died half-way), after STALE_AFTER_S; the next launch then takes it over."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.recipes import RUNS_DIR
from tpu_console.runs import ownership

LOCK_DIR = "tpu-console/launch.lock"  # relative to the worker's home
OWNER_FILE = "owner.json"
STALE_AFTER_S = 30 * 60  # a launch without a run yet: longer than any launch's checks, sync and setup


def acquire_recipe(owner: dict[str, Any], stale_after_s: int = STALE_AFTER_S) -> str:
    """Take the lock: prints `@@ lock taken`, `@@ lock taken-over` (a stale holder was removed first), or
    `@@ lock held` then `@@ owner <the holder's owner.json on one line>`."""
    lock = f'"$HOME"/{shlex.quote(LOCK_DIR)}'
    text = shlex.quote(json.dumps(owner))
    return (
        f"( l={lock}; mkdir -p \"$(dirname \"$l\")\"\n"
        f"take() {{ mkdir \"$l\" 2>/dev/null && printf '%s\\n' {text} > \"$l/{OWNER_FILE}\"; }}\n"
        "if take; then echo '@@ lock taken'; exit 0; fi\n"
        # the holder writes owner.json just after its mkdir: a moment (2 s at most) for it to be whole
        "o=; n=0; while [ -d \"$l\" ]; do\n"
        f"  o=$(tr -d '\\n' < \"$l/{OWNER_FILE}\" 2>/dev/null)\n"
        "  case \"$o\" in *'}') break;; esac\n"
        "  n=$((n + 1)); [ $n -ge 20 ] && break; sleep 0.1; done\n"
        "run=$(printf '%s' \"$o\" | sed -n 's/.*\"run_id\": *\"\\([^\"]*\\)\".*/\\1/p')\n"
        "stale=0\n"
        f'if [ -n "$run" ]; then d="$HOME"/{shlex.quote(RUNS_DIR)}/"$run"; pg=$(cat "$d/pid" 2>/dev/null)\n'
        '  if [ -e "$d/exit" ] || ! { case "$pg" in ""|*[!0-9]*) false;; esac && kill -0 -- "-$pg" '
        "2>/dev/null; }; then stale=1; fi\n"
        f"else age=$(( $(date +%s) - $(stat -c %Y \"$l\" 2>/dev/null || echo 0) ))\n"
        f"  [ \"$age\" -gt {int(stale_after_s)} ] && stale=1; fi\n"
        "if [ $stale = 1 ]; then rm -rf \"$l\"; if take; then echo '@@ lock taken-over'; exit 0; fi; fi\n"
        "echo '@@ lock held'; printf '@@ owner %s\\n' \"$o\"; exit 0 )"
    )


def keep_recipe(owner: dict[str, Any]) -> str:
    """The lock stays with the run that started: owner.json names it (replaced atomically)."""
    lock = f'"$HOME"/{shlex.quote(LOCK_DIR)}'
    return (f"( printf '%s\\n' {shlex.quote(json.dumps(owner))} > {lock}/{OWNER_FILE}.tmp && "
            f"mv {lock}/{OWNER_FILE}.tmp {lock}/{OWNER_FILE} )")


def release_recipe(run_id: str | None = None, token: str | None = None) -> str:
    """Remove the lock if it is this run's (`run_id`) or this launch's (`token`); anyone else's stays."""
    lock = f'"$HOME"/{shlex.quote(LOCK_DIR)}'
    marks = [f'"run_id": "{run_id}"' if run_id else None, f'"token": "{token}"' if token else None]
    tests = " || ".join(f"grep -qF {shlex.quote(m)} {lock}/{OWNER_FILE}" for m in marks if m)
    # the folder the lock made on a fresh worker goes too: a refused launch leaves nothing behind
    return f"( if {tests}; then rm -rf {lock}; rmdir \"$HOME\"/tpu-console 2>/dev/null; fi; exit 0 )"


@dataclass(frozen=True)
class Holder:
    user: str
    host: str | None
    since: float | None
    run_id: str | None

    def describe(self) -> str:
        when = (datetime.fromtimestamp(self.since, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                if self.since else "an unknown time")
        return f"{self.user}" + (f" on {self.host}" if self.host else "") + f" since {when}"


def parse_acquire(stdout: str) -> Holder | None:
    """None when the lock was taken; the holder when it is held."""
    if "@@ lock taken" in stdout:
        return None
    line = next((ln for ln in stdout.splitlines() if ln.startswith("@@ owner ")), "@@ owner ")
    try:
        owner = json.loads(line[len("@@ owner "):])
    except ValueError:
        owner = {}
    owner = owner if isinstance(owner, dict) else {}
    since = owner.get("since")
    return Holder(str(owner.get("user") or "someone"), owner.get("host"),
                  float(since) if isinstance(since, int | float) else None, owner.get("run_id"))


class LaunchLock:
    """`async with LaunchLock(fleet, worker, node) as lock:` around a launch; `lock.keep(run_id)` once its
    job started (the run then holds it); leaving the block without it releases the lock."""

    def __init__(self, fleet: Fleet, worker: int, node: str) -> None:
        self._fleet, self._worker, self._node = fleet, worker, node
        self._owner = {**ownership.me(), "since": time.time(), "token": ownership.new_token(),
                       "run_id": None}
        self._kept = False

    async def __aenter__(self) -> LaunchLock:
        (result,) = await self._fleet.run(acquire_recipe(self._owner), [self._worker], timeout=60)
        if not result.ok:
            raise UserError(f"could not take the launch lock on worker {self._worker} of {self._node} "
                            f"({result.error or result.stderr.strip() or result.exit_status}); nothing was "
                            "launched")
        holder = parse_acquire(result.stdout)
        if holder is not None and holder.run_id:
            raise UserError(f"run {holder.run_id} is still running on {self._node}, which is held by "
                            f"{holder.describe()}; stop it first with `tpu-console stop {self._node} "
                            f"{holder.run_id}`")
        if holder is not None:
            raise UserError(f"{self._node} is held by {holder.describe()} for a launch in progress; nothing "
                            "was launched (wait for it, then look with `tpu-console runs "
                            f"{self._node}`)")
        return self

    async def keep(self, run_id: str) -> None:
        self._owner["run_id"] = run_id
        await self._fleet.run(keep_recipe(self._owner), [self._worker], timeout=60)
        self._kept = True

    async def __aexit__(self, *exc_info: object) -> None:
        if not self._kept:
            await self._fleet.run(release_recipe(token=self._owner["token"]), [self._worker], timeout=60)
