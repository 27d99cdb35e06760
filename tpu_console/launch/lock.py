"""Launching is exclusive across consoles: an atomic lock on the pod (`mkdir ~/tpu-console/launch.lock`
on the node's worker 0, whichever workers a launch selects; on a multislice with slices lost, the first
host of the first slice left: `lock_worker`), with `owner.json` saying who holds it, from where, since when
and, once the job started, for which run. Of any number of launches at once on one node, on any worker
subsets, exactly one takes it; the others are refused naming the holder.

The lock is released when a launch fails, when its run is stopped (on every worker where a run of the
node may hold it, `lock_places`: a run launched on the slices left of a multislice holds it on the first
host of the first of them, which need not be worker 0 once the lost slices are back), and is recognised as
released once its run has ended (no live process group, or an `exit` file) or, for a launch that never got
as far as a run (its console died half-way), after STALE_AFTER_S; the next launch then takes it over. A
run on a worker subset without worker 0 is seen ended where it runs (owner.json's `run_worker`): the
acquirer asks that worker, then takes the lock over only if it still names the holder it asked about (a
compare-and-swap on the holder's token), so a lock taken meanwhile by a third launch is never removed.

Every recipe holds `flock` on the worker's home folder while it looks and acts, so taking, taking over,
keeping and releasing never interleave: without it, two launches that both saw the same stale holder could
both remove it and both win (one removing the lock the other had just taken). The home folder, not a file
of ours, is what is locked because it is never removed (a removed and re-made guard would be two locks)
and a refused launch leaves nothing behind; the kernel drops a flock when its holder dies, so a console
killed half-way blocks nobody."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tpu_console.domain import Node
from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.run_recipes import RUNS_DIR
from tpu_console.history import ownership

LOCK_DIR = "tpu-console/launch.lock"  # relative to the worker's home
OWNER_FILE = "owner.json"
LOCK_WORKER = 0  # one place per node: launches on different worker subsets meet there
STALE_AFTER_S = 30 * 60  # a launch without a run yet: longer than any launch's checks, sync and setup
GUARD_WAIT_S = 20  # longer than any recipe holds the guard (a few file operations)


def _guarded(body: str) -> str:
    """BODY in a subshell holding flock on the home folder (fd 9); `@@ lock busy` if it is not had in time."""
    return (
        f'( l="$HOME"/{shlex.quote(LOCK_DIR)}; exec 9<"$HOME"\n'
        f"flock -w {GUARD_WAIT_S} 9 || {{ echo '@@ lock busy'; exit 0; }}\n"
        f"{body} )"
    )


def acquire_recipe(owner: dict[str, Any], stale_after_s: int = STALE_AFTER_S,
                   ended_token: str | None = None) -> str:
    """Take the lock: prints `@@ lock taken`, `@@ lock taken-over` (a stale holder was removed first), or
    `@@ lock held` (`@@ lock held-elsewhere`: by a run on another worker, whose end this worker cannot see)
    then `@@ owner <the holder's owner.json on one line>`. `ended_token`: the holder whose run the caller saw
    ended on its own worker; it is taken over if it still holds the lock."""
    text = shlex.quote(json.dumps(owner))
    ended = shlex.quote(f'"token": "{ended_token}"') if ended_token else "''"
    return _guarded(
        "take() { mkdir -p \"$(dirname \"$l\")\" && mkdir \"$l\" 2>/dev/null &&\n"
        f"  printf '%s\\n' {text} > \"$l/{OWNER_FILE}\"; }}\n"
        "if take; then echo '@@ lock taken'; exit 0; fi\n"
        f"o=$(tr -d '\\n' < \"$l/{OWNER_FILE}\" 2>/dev/null)\n"
        "run=$(printf '%s' \"$o\" | sed -n 's/.*\"run_id\": *\"\\([^\"]*\\)\".*/\\1/p')\n"
        f"stale=0; ended={ended}; here=1\n"
        # where the holder's run lives: here, unless owner.json names another worker
        f"case \"$o\" in *'\"run_worker\": '*) case \"$o\" in *'\"run_worker\": {LOCK_WORKER},'*|"
        f"*'\"run_worker\": {LOCK_WORKER}}}'*|*'\"run_worker\": null'*) ;; *) here=0;; esac;; esac\n"
        'if [ -n "$ended" ] && printf %s "$o" | grep -qF "$ended"; then stale=1\n'
        'elif [ -n "$run" ] && [ $here = 0 ]; then\n'
        "  echo '@@ lock held-elsewhere'; printf '@@ owner %s\\n' \"$o\"; exit 0\n"
        f'elif [ -n "$run" ]; then d="$HOME"/{shlex.quote(RUNS_DIR)}/"$run"; pg=$(cat "$d/pid" 2>/dev/null)\n'
        '  if [ -e "$d/exit" ] || ! { case "$pg" in ""|*[!0-9]*) false;; esac && kill -0 -- "-$pg" '
        "2>/dev/null; }; then stale=1; fi\n"
        f"else age=$(( $(date +%s) - $(stat -c %Y \"$l\" 2>/dev/null || echo 0) ))\n"
        f"  [ \"$age\" -gt {int(stale_after_s)} ] && stale=1; fi\n"
        "if [ $stale = 1 ]; then rm -rf \"$l\"; if take; then echo '@@ lock taken-over'; exit 0; fi; fi\n"
        "echo '@@ lock held'; printf '@@ owner %s\\n' \"$o\"; exit 0"
    )


def keep_recipe(owner: dict[str, Any]) -> str:
    """The lock stays with the run that started: owner.json names it (replaced atomically)."""
    text = shlex.quote(json.dumps(owner))
    return _guarded(f"printf '%s\\n' {text} > \"$l/{OWNER_FILE}.tmp\" && "
                    f"mv \"$l/{OWNER_FILE}.tmp\" \"$l/{OWNER_FILE}\"")


def release_recipe(run_id: str | None = None, token: str | None = None) -> str:
    """Remove the lock if it is this run's (`run_id`) or this launch's (`token`); anyone else's stays."""
    marks = [f'"run_id": "{run_id}"' if run_id else None, f'"token": "{token}"' if token else None]
    tests = " || ".join(f'grep -qF {shlex.quote(m)} "$l/{OWNER_FILE}"' for m in marks if m)
    # the folders the lock made on a fresh worker go too: a refused launch leaves nothing behind
    return _guarded(f'if {tests}; then rm -rf "$l"; rmdir "$HOME"/tpu-console 2>/dev/null; fi; '
                    "exit 0")


@dataclass(frozen=True)
class Holder:
    user: str
    host: str | None
    since: float | None
    run_id: str | None
    token: str | None = None
    run_worker: int | None = None  # where the run's end is seen, when it is not the lock's worker

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
    run_worker = owner.get("run_worker") if "@@ lock held-elsewhere" in stdout else None
    return Holder(str(owner.get("user") or "someone"), owner.get("host"),
                  float(since) if isinstance(since, int | float) else None, owner.get("run_id"),
                  owner.get("token"), run_worker if isinstance(run_worker, int) else None)


def run_ended_recipe(run_id: str) -> str:
    """Prints `@@ run ended` when RUN_ID's folder on this worker has an exit file or no live process group."""
    folder = f'"$HOME"/{shlex.quote(RUNS_DIR)}/{shlex.quote(run_id)}'
    return (f'( d={folder}; pg=$(cat "$d/pid" 2>/dev/null)\n'
            'if [ -e "$d/exit" ] || ! { case "$pg" in ""|*[!0-9]*) false;; esac && kill -0 -- "-$pg" '
            "2>/dev/null; }; then echo '@@ run ended'; fi; exit 0 )")


def lock_worker(node: Node) -> int:
    """Where the node's launches meet: worker 0; on a multislice some of whose slices are lost (a run
    going on on the others), the first host of the first slice left, which every launch reads alike."""
    ready = node.ready_slices
    return LOCK_WORKER if not ready or ready[0] == 0 else ready[0] * node.workers_per_slice


def lock_places(node: Node) -> tuple[int, ...]:
    """Every worker where a run of the node may hold the lock: the first host of each slice (worker 0
    first), since `lock_worker` depended on which slices were READY when the run was launched, not now."""
    return tuple(index * node.workers_per_slice for index in range(node.slices))


class LaunchLock:
    """`async with LaunchLock(fleet, node) as lock:` around a launch; `lock.keep(run_id)` once its job
    started (the run then holds it); leaving the block without it releases the lock."""

    def __init__(self, fleet: Fleet, node: str, run_worker: int = LOCK_WORKER, at: int = LOCK_WORKER) -> None:
        self._fleet, self._worker, self._node = fleet, at, node
        self._owner = {**ownership.me(), "since": time.time(), "token": ownership.new_token(),
                       "run_id": None, "run_worker": run_worker}
        self._kept = False

    async def _acquire(self, ended_token: str | None = None) -> Any:
        recipe = acquire_recipe(self._owner, ended_token=ended_token)
        (result,) = await self._fleet.run(recipe, [self._worker], timeout=60)
        return result

    async def _run_ended(self, holder: Holder) -> bool:
        """Whether the holder's run, on another worker, has ended there (unreachable: it has not)."""
        if holder.run_id is None or holder.run_worker not in self._fleet.targets:
            return False
        (result,) = await self._fleet.run(run_ended_recipe(holder.run_id), [holder.run_worker], timeout=60)
        return result.ok and "@@ run ended" in result.stdout

    async def __aenter__(self) -> LaunchLock:
        result = await self._acquire()
        holder = parse_acquire(result.stdout) if result.ok else None
        if holder is not None and holder.run_worker is not None and await self._run_ended(holder):
            result = await self._acquire(ended_token=holder.token)
        if not result.ok:
            raise UserError(f"could not take the launch lock on worker {self._worker} of {self._node} "
                            f"({result.error or result.stderr.strip() or result.exit_status}); nothing was "
                            "launched")
        if "@@ lock busy" in result.stdout:
            raise UserError(f"the launch lock on worker {self._worker} of {self._node} stayed busy for "
                            f"{GUARD_WAIT_S} s (another console is launching or stopping there); nothing was "
                            "launched: try again")
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
