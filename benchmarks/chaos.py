"""The controller under chaos: a managed run of the tiny trainer on emulated Cloud TPU nodes (the TPU API
emulator for what the cloud says, a local pod for the workers: tests/emulated_pods.py), brought back
after every preemption by controller processes that are themselves SIGKILLed, against an uninterrupted run
of the same seed.

    JAX_PLATFORMS=cpu .venv/bin/python benchmarks/chaos.py [--steps 200] [--every 4] [--preemptions 5]
        [--kills 5] [--seed 0]

What it does, in one run:
- a reference: the same config, uninterrupted, on a local pod of its own (its final loss and parameters);
- the managed run: created in the first zone, launched, handed to the controller; two controller processes
  started together (one must act); `--preemptions` preemptions at random steps (the node PREEMPTED in the
  emulator, the pod's jobs killed without a word); before the second recovery its zone fills its queued
  request only after a wait (a request filled late), before the third its zone fails every request (the
  create moves to the next zone); during the recoveries the acting controller is SIGKILLed `--kills`
  times at random moments (another takes over when the lease expires; a new one is started each time so
  that two are always up);
- a thread looks at the emulator every 50 ms: never two live nodes or waiting requests of the run;
- at the end: the step reached, the steps lost per preemption (the last step made before it, read from the
  pod's own events, less the step the new run resumed after), the seconds from each preemption to the next
  first step and what they were made of, the nodes and queued requests left, the final loss and parameters
  against the reference's; and the launch lock: of 8 launches racing on one node after a run ended, how
  many won, in 50 trials.
Slices that shrink and grow (a 2-slice run losing one slice) are not measured here yet: see
`measure_slices`, the hook for them.

`--serve-controller` is one controller process (what the measure starts and kills).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.emulated_pods import EmulatedPods  # noqa: E402 - the repository root first
from tests.tpu_api_emulator import TpuApiEmulator  # noqa: E402

PROJECT, ZONES, NAME, LOCAL_TYPE = "chaos", ["zone-a", "zone-b", "zone-c"], "chaos", "local-1x1"
# the tiny model rewarded for digits: it learns (a non-zero loss and gradient every step), so the final
# parameters of the interrupted run and the uninterrupted one can differ if resumption is not exact
CONFIG = ROOT / "trainer" / "configs" / "tiny_toy_reward.yaml"


# ---- one controller process ------------------------------------------------------------------------------


async def serve_controller(endpoint: str, store_dir: str, pods_root: str) -> None:
    from tpu_console.controller.loop import Controller
    from tpu_console.controller.store import FolderStore

    provider = EmulatedPods(endpoint, PROJECT, ZONES, Path(pods_root))
    controller = Controller({"gcp": provider}, FolderStore(store_dir), poll_s=0.5, read_timeout_s=20,
                            lease_ttl_s=3.0, where=f"chaos pid {os.getpid()}",
                            progress=lambda line: print(f"{time.time():.2f} {line}", flush=True))
    print(f"{time.time():.2f} controller {controller.id} pid {os.getpid()}", flush=True)
    await controller.serve()


# ---- the measure -----------------------------------------------------------------------------------------


class Watch(threading.Thread):
    """The run's live nodes and waiting queued requests in the emulator, every 50 ms: the most at once."""

    def __init__(self, api: TpuApiEmulator, store_dir: Path) -> None:
        super().__init__(daemon=True)
        self.api, self.most, self.polls, self.done = api, 0, 0, threading.Event()
        self.store_dir, self.actors = store_dir, []  # the controllers whose journal writes were seen, in turn

    def live(self) -> tuple[int, int]:
        with self.api._lock:
            nodes = [n for n in self.api._nodes.values() if n.node_id == NAME
                     and n.body.get("state") not in ("PREEMPTED", "TERMINATED", "DELETING")]
            waiting = [q for q in self.api._queued.values() if q.qr_id == NAME
                       and q.body.get("state", {}).get("state") not in ("FAILED", "DELETING", "ACTIVE")]
        return len(nodes), len(waiting)

    def run(self) -> None:
        from tpu_console.controller import state as st
        from tpu_console.controller.store import FolderStore

        store = FolderStore(self.store_dir)
        while not self.done.is_set():
            nodes, waiting = self.live()
            self.most, self.polls = max(self.most, nodes + waiting), self.polls + 1
            if self.polls % 10 == 0:
                for stored in st.all_runs(store):
                    by = (stored.run.intent or {}).get("by")
                    if by and by != "launch" and (not self.actors or self.actors[-1] != by):
                        self.actors.append(by)
            time.sleep(0.05)


class Controllers:
    """Controller processes: started, read, killed."""

    def __init__(self, work: Path, endpoint: str, store_dir: Path, pods_root: Path, env: dict[str, str]):
        self.work, self.endpoint, self.store_dir, self.pods_root, self.env = work, endpoint, store_dir, \
            pods_root, env
        self.processes: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        log = (self.work / f"controller-{len(self.processes)}.log").open("w")
        process = subprocess.Popen(
            [sys.executable, __file__, "--serve-controller", self.endpoint, str(self.store_dir),
             str(self.pods_root)], stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)
        self.processes.append(process)
        return process

    def holder_pid(self) -> int | None:
        from tpu_console.controller.lease import read_lease
        from tpu_console.controller.store import FolderStore

        lease = read_lease(FolderStore(self.store_dir))
        return None if lease is None else int(lease["holder"]["pid"])

    def kill_holder(self) -> int | None:
        pid = self.holder_pid()
        alive = {p.pid: p for p in self.processes if p.poll() is None}
        if pid not in alive:
            return None
        os.kill(pid, signal.SIGKILL)
        alive[pid].wait()
        self.start()  # two are always up
        return pid

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def events(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def last_step(path: Path) -> int | None:
    steps = [e["step"] for e in events(path) if e.get("kind") == "step" and isinstance(e.get("step"), int)]
    return max(steps) if steps else None


def make_inputs(folder: Path) -> tuple[Path, Path]:
    model, data = folder / "tiny-qwen2", folder / "gsm8k-synthetic.jsonl"
    for args in (["make-tiny-model", str(model)], ["make-gsm8k-jsonl", str(data)]):
        subprocess.run([sys.executable, "-m", "trainer", *args], check=True, capture_output=True, cwd=ROOT)
    return model, data


def trainer_sets(args: argparse.Namespace, model: Path, data: Path, ckpt: Path) -> list[str]:
    return [f"steps={args.steps}", f"seed={args.seed}", f"checkpoint.dir={ckpt}",
            f"checkpoint.every_steps={args.every}", f"model_path={model}", f"data.path={data}",
            "eval_every_steps=0", "rollout.global_length=64", "rollout.max_length_sample=8"]


async def reference_run(args: argparse.Namespace, sets: list[str]) -> dict[str, Any]:
    """The same config uninterrupted, on a local pod of its own: its last step event."""
    from tpu_console.domain import CreateRequest
    from tpu_console.launch.start import launch
    from tpu_console.providers.local import LocalProvider

    providers = {"local": LocalProvider()}
    try:
        await providers["local"].create(CreateRequest("reference", LOCAL_TYPE))
        result = await launch(providers, "reference", str(CONFIG), sets, python=sys.executable,
                              check_ports=False)
        assert result.ok, result.starts
        path = providers["local"].store.worker_dir("reference", 0) / result.run_dir / "events.jsonl"
        started = time.monotonic()
        while not any(e.get("kind") in ("end", "error") for e in events(path)):
            await asyncio.sleep(1.0)
        steps = [e for e in events(path) if e.get("kind") == "step"]
        return {"last": steps[-1] if steps else None, "seconds": time.monotonic() - started,
                "error": next((e for e in events(path) if e.get("kind") == "error"), None)}
    finally:
        await providers["local"].close()


def final_params(ckpt: Path, step: int) -> dict[str, Any]:
    """The parameters of checkpoint `step`, as numpy arrays by path."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    restored = ocp.CheckpointManager(str(ckpt)).restore(step, args=ocp.args.StandardRestore())
    leaves = jax.tree_util.tree_leaves_with_path(restored["params"])
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in leaves}


def lock_race(folder: Path, trials: int = 50, launches: int = 8) -> list[int]:
    """Of `launches` launches racing on one node after its run ended, how many won, per trial."""
    from concurrent.futures import ThreadPoolExecutor

    from tpu_console.launch import lock as launch_lock

    def sh(command: str) -> str:
        return subprocess.run(["bash", "-c", command], env={**os.environ, "HOME": str(folder)},
                              capture_output=True, text=True, timeout=60, check=True).stdout

    def owner(user: str, token: str, run_id: str | None = None) -> dict:
        return {"user": user, "host": "h", "home": "h", "since": time.time(), "token": token,
                "run_id": run_id}

    run_id = "20260101-000000-abcd"
    (folder / "tpu-console" / "runs" / run_id).mkdir(parents=True)
    (folder / "tpu-console" / "runs" / run_id / "exit").write_text("0\n")
    winners = []
    with ThreadPoolExecutor(launches) as pool:
        for _ in range(trials):
            sh(launch_lock.acquire_recipe(owner("first", "t0")))
            sh(launch_lock.keep_recipe(owner("first", "t0", run_id)))
            outputs = list(pool.map(lambda i: sh(launch_lock.acquire_recipe(owner(f"u{i}", f"t{i}"))),
                                    range(launches)))
            winners.append(sum(1 for out in outputs if launch_lock.parse_acquire(out) is None))
            holder = json.loads((folder / launch_lock.LOCK_DIR / launch_lock.OWNER_FILE).read_text())
            sh(launch_lock.release_recipe(token=holder["token"]))
    return winners


def measure_slices(args: argparse.Namespace) -> str:
    """The hook for slices that shrink and grow (a 2-slice run losing one slice and growing back): it
    needs the elastic relaunch, which is not in the controller yet."""
    return "not measured: a 2-slice run that loses a slice is recovered whole today (no shrink and grow yet)"


async def measure(args: argparse.Namespace) -> int:
    from tpu_console.controller import relaunch
    from tpu_console.controller import state as st
    from tpu_console.controller.handover import Budgets, hand_over
    from tpu_console.controller.store import FolderStore
    from tpu_console.domain import CreateRequest
    from tpu_console.launch.job_kinds import validate_config
    from tpu_console.launch.start import launch
    from tpu_console.observe.supervision import SupervisionPolicy
    from tpu_console.providers.nodes import create_node

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    home = work / "home"
    home.mkdir()
    os.environ["TPU_CONSOLE_HOME"] = str(home)
    env = {**os.environ, "TPU_CONSOLE_HOME": str(home), "JAX_PLATFORMS": "cpu"}
    print(f"# work folder {work}", flush=True)
    model, data = make_inputs(work)
    ref_sets = trainer_sets(args, model, data, work / "ckpt-reference")
    print("# the reference run (uninterrupted) ...", flush=True)
    reference = await reference_run(args, ref_sets)
    print(f"# reference: {last_metrics(reference['last'])} in {reference['seconds']:.0f} s", flush=True)

    api = TpuApiEmulator(create_delay=0.5, delete_delay=0.3, update_delay=0.05, queue_delay=0.2)
    endpoint = api.start()
    # a SIGKILLed controller's connections reset: the server need not print each (socketserver would)
    api._server.handle_error = lambda *_a: None
    pods_root, store_dir = home / "local", work / "controller-store"
    watch = Watch(api, store_dir)
    watch.start()
    provider = EmulatedPods(endpoint, PROJECT, ZONES, pods_root)
    providers = {"gcp": provider}
    store = FolderStore(store_dir)
    controllers = Controllers(work, endpoint, store_dir, pods_root, env)
    ckpt = work / "ckpt-chaos"
    sets = trainer_sets(args, model, data, ckpt)
    rows: list[dict[str, Any]] = []
    killed: list[str] = []
    try:
        await create_node(providers, "gcp", CreateRequest(NAME, LOCAL_TYPE, zones=(ZONES[0],), spot=True))
        policy = SupervisionPolicy(fail_fast=True)
        result = await launch(providers, NAME, str(CONFIG), sets, python=sys.executable, policy=policy,
                              check_ports=False)
        assert result.ok, result.starts
        job = relaunch.job_of_trainer(validate_config(CONFIG, sets), None, sys.executable, policy,
                                      check_ports=False)
        managed = hand_over(store, result, job, ZONES, Budgets(max_recoveries=args.preemptions + 3,
                                                                 confirm_s=1.0, queued=True))
        both = [controllers.start(), controllers.start()]  # two controllers started together
        targets = sorted(rng.sample(range(8, args.steps - 8), args.preemptions))
        kill_during = set(rng.sample(range(args.preemptions), min(args.kills, args.preemptions)))
        extra_kills = max(0, args.kills - args.preemptions)
        for index, target in enumerate(targets):
            run = st.load(store, managed.id).run
            run_id = run.current.run_id
            path = pods_root / NAME / "workers" / "0" / "tpu-console" / "runs" / str(run_id) / "events.jsonl"
            while (last_step(path) or 0) < target:
                if any(e.get("kind") in ("end", "error") for e in events(path)):
                    raise RuntimeError(f"the run ended before step {target}: {events(path)[-1]}")
                await asyncio.sleep(0.2)
            zone = run.current.zone or ZONES[0]
            note = []
            if index == 1:  # its zone fills the next request only after a wait
                api.capacity_after(zone, 20.0)
                note.append(f"request in {zone} filled after 20 s")
            if index == 2:  # its zone fails every request: the create moves on
                api.fail_queued(zone, "There is no more capacity in the zone.")
                note.append(f"create failed in {zone}")
            made = last_step(path)
            at = time.time()
            api.preempt(zone, NAME)
            await provider.pods.preempt(NAME)
            if index in kill_during or (index == args.preemptions - 1 and extra_kills):
                for _ in range(1 + (extra_kills if index == args.preemptions - 1 else 0)):
                    await asyncio.sleep(rng.uniform(1.0, 25.0))
                    pid = controllers.kill_holder()
                    if pid is not None:
                        stage = (st.load(store, managed.id).run.intent or {}).get("action")
                        killed.append(f"pid {pid} during {stage}")
                        note.append(f"controller killed during {stage}")
            while True:
                run = st.load(store, managed.id).run
                recovery = next((r for r in run.recoveries if r.n == index + 1), None)
                if recovery is not None and recovery.first_step_at is not None:
                    break
                if run.state.terminal:
                    raise RuntimeError(f"the managed run ended: {run.status} {run.note}")
                await asyncio.sleep(0.5)
            api._capacity_after.pop(zone, None)
            api._queued_failures.pop(zone, None)
            rows.append({"n": index + 1, "target": target, "made": made, "resumed": recovery.resumed_step,
                         "lost": None if made is None else made - (recovery.resumed_step or 0),
                         "seconds": recovery.first_step_at - at, "parts": recovery.parts(),
                         "detect_after": recovery.detected_at - at, "zone": recovery.zone,
                         "note": "; ".join(note)})
            print(f"# preemption {index + 1} at step {made}: back after {rows[-1]['seconds']:.0f} s",
                  flush=True)
        while not (run := st.load(store, managed.id).run).state.terminal or run.intent:
            await asyncio.sleep(1.0)
        for _ in range(40):
            if watch.live() == (0, 0):
                break
            await asyncio.sleep(0.25)
        with api._lock:
            nodes_left = sum(1 for n in api._nodes.values() if n.node_id == NAME)
            requests_left = sum(1 for q in api._queued.values() if q.qr_id == NAME)
    finally:
        controllers.stop()
        watch.done.set()
        await provider.close()
        api.stop()
    print_table(args, rows, run, reference, ckpt, work, nodes_left, requests_left, watch, killed, both)
    return 0


def print_table(args, rows, run, reference, ckpt, work, nodes_left, requests_left, watch, killed,
                both) -> None:
    import numpy as np

    from tpu_console.views.nodes import format_table

    print()
    print(f"managed run {run.id}: {run.status}; {len(run.incarnations)} incarnations, "
          f"{len(run.recoveries)} recoveries")
    table = [(str(r["n"]), str(r["made"]), str(r["resumed"]), str(r["lost"]), f"{r['seconds']:.1f}",
              *(f"{r['parts'][k]:.1f}" if r["parts"].get(k) is not None else "-"
                for k in ("detect", "delete", "create", "bootstrap", "sync", "start")),
              r["zone"] or "-", r["note"]) for r in rows]
    print(format_table(("#", "LAST STEP", "RESUMED AFTER", "LOST", "TO FIRST STEP S", "DETECT", "DELETE",
                        "CREATE", "BOOTSTRAP", "SYNC", "START", "ZONE", "NOTE"), table))
    seconds = [r["seconds"] for r in rows]
    lost = [r["lost"] for r in rows if r["lost"] is not None]
    last = run.incarnations[-1]
    print()
    print(f"step reached: {last.last_step} of {args.steps}")
    print(f"steps lost per preemption: max {max(lost) if lost else '-'} (checkpoint every {args.every})")
    if seconds:
        print(f"preemption to the next first step: median {statistics.median(seconds):.1f} s, worst "
              f"{max(seconds):.1f} s (detect includes the {run.confirm_s:g} s between the two reads)")
    print(f"left at the end: {nodes_left} node(s), {requests_left} queued request(s); the most live at once "
          f"over {watch.polls} polls: {watch.most}")
    print(f"controllers: 2 started together (pids {both[0].pid}, {both[1].pid}); SIGKILLed {len(killed)}: "
          + "; ".join(killed))
    print(f"acting controllers, in turn: {len(watch.actors)} ({' -> '.join(watch.actors)}); one at a time, "
          f"a new one only after the one acting was killed: {len(watch.actors) <= 1 + len(killed)}")
    print(f"final step, chaos:         {final_loss(run)}")
    print(f"final step, uninterrupted: {last_metrics(reference['last'])}")
    try:
        ours, theirs = final_params(ckpt, args.steps), final_params(work / "ckpt-reference", args.steps)
        diff = max(float(np.max(np.abs(ours[k] - theirs[k]))) for k in theirs)
        print(f"final parameters (checkpoint {args.steps}): max |chaos - uninterrupted| = {diff:.3g} over "
              f"{len(theirs)} arrays")
    except Exception as exc:  # noqa: BLE001 - said, not hidden
        print(f"final parameters: not compared ({type(exc).__name__}: {exc})")
    print(measure_slices(args))
    winners = lock_race(work / "lock-race")
    print(f"launch lock: of 8 launches racing after a run ended, exactly one won in "
          f"{sum(1 for w in winners if w == 1)} trials of {len(winners)} (winners per trial: "
          f"{sorted(set(winners))})")


def final_loss(run: Any) -> Any:
    """The last step's loss of the final incarnation, from the run's archive (its node is swept)."""
    from tpu_console import locations

    path = locations.home() / "archive" / str(run.incarnations[-1].run_id) / "worker-0" / "events.jsonl"
    steps = [e for e in events(path) if e.get("kind") == "step"]
    return last_metrics(steps[-1] if steps else None)


def last_metrics(event: dict[str, Any] | None) -> str:
    if not event:
        return "-"
    return (f"step {event.get('step')}: loss {event.get('loss')}, reward "
            f"{event.get('train-reward/total/mean')}, entropy {event.get('entropy')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--preemptions", type=int, default=5)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve-controller", nargs=3, metavar=("ENDPOINT", "STORE", "PODS"))
    args = parser.parse_args()
    if args.serve_controller:
        asyncio.run(serve_controller(*args.serve_controller))
        return 0
    print("$ " + shlex.join([Path(sys.executable).name, "benchmarks/chaos.py", *sys.argv[1:]]), flush=True)
    status = asyncio.run(measure(args))
    sys.stdout.flush()
    os._exit(status)  # a library's worker thread (orbax, the TPU client) would keep the process up


if __name__ == "__main__":
    sys.exit(main())
