"""The run's supervisor: one process per run, on the run's first worker, that looks after the run with the
console gone (a laptop asleep, a terminal closed).

`launch` starts it detached in worker 0's run folder (`python3 supervisor.py`), before the jobs; it serves
HTTP on the pod's network and writes `supervisor.port` once listening (report_server.py). Every worker's
job runs under a job runner (job_runner.py) that reports to it: the job's start, a heartbeat with its last
step, and its exit status with the failure class read from its log. The answers carry the supervisor's
orders: carry on, stop the job, start it again, or end. What it decides goes to `supervisor.jsonl` in the
run folder (one JSON object per line: `t`, `decision`, `message`), which the console shows.

It reads the run's record, `launch.json` (run_record.py: the run's id, node, provider, workers, start time,
price and fail-fast, written once by `launch` before it starts the supervisor), `supervision.json` (the
plan `launch` wrote, 0600: its orders) and, when webhook notifications are set up, `.notify` (0600: the
webhook URL is a secret, so it is never on a command line). It enforces:

- fail-fast: when one worker's job fails, stop the others (they would hang in a collective);
- restart by failure class: a failure of a class named in `restart_on` starts every job again (they resume
  from their latest checkpoint), up to `max_restarts` per class;
- `max_cost` (price x time since launch) and `max_hang_s` (every worker without a new step that long):
  stop the jobs (SIGTERM first, so the trainer checkpoints), then delete the node;
- `on_straggler` (report, restart): a worker whose step time over its last steps is the plan's `pace`
  factor times the others' median (observe/stragglers.py's rule, applied to the steps the runners report) is
  named in a decision; with restart, every job is started again from its latest checkpoint, up to
  `max_restarts` times;
- `on_end: delete`: once every job has ended and `grace_s` has passed, delete the node, unless a newer run
  started on it;
- a preemption notice: a job runner that sees its VM going (the metadata server, the VM's shutdown;
  preemption_notice.py) tells its job at once and reports it here; the notice is passed to every other
  worker's runner in its next answer, so all jobs checkpoint together; failures that follow (peers gone
  from a collective) are not restarted, and the run ends `preempted`.

Its parts, each a module beside it: how the runners reach it (report_server.py), the webhook's messages
(webhook.py), who straggles (step_pace.py), the run's record that outlives the node, written when the run
has ended and again just before the node is deleted (bucket_writer.py), and the node's deletion
(node_deletion.py): on Cloud TPU the TPU API's DELETE with the VM's own credentials (google_apis.py), on a
local pod the console's own removal, the command the plan names.

The console's facts it judges by come in the plan, never as copies here: health's thresholds
(observe/health.py), the failure signatures, the removal of a local pod, where the record goes.

Python 3.8+ and the standard library only; it imports nothing of the console. Its modules (the ones named
here, run_record.py and preemption_notice.py) are shipped beside it into the run folder (launch/start.py).
"""

import json
import os
import signal
import socket
import sys
import threading
import time

try:  # shipped into the run folder beside this file (launch/start.py)
    import preemption_notice
except ImportError:
    preemption_notice = None
try:  # beside this file in the run folder (launch/start.py ships them)
    import bucket_writer
    import node_deletion
    import report_server
    import run_record
    import step_pace
    import webhook
except ImportError:  # imported as tpu_console.worker.supervisor (the console's tests)
    from tpu_console.worker import bucket_writer, node_deletion, report_server, run_record, step_pace, webhook

PLAN_FILE = "supervision.json"
DECISIONS_FILE = "supervisor.jsonl"
TICK_S = 0.25

# Orders in the answers to a job runner.
RUN, STOP, RESTART, WAIT, DONE, PREEMPT = "run", "stop", "restart", "wait", "done", "preempt"


def now():
    return time.time()


class WorkerView:
    """What the supervisor knows of one worker's job."""

    def __init__(self, index, started):
        self.index = index
        self.attempt = 0
        self.state = "pending"  # pending, running, exited, done, lost
        self.last_seen = started
        self.step = None
        self.progress_at = started  # when its step last changed (or it started)
        self.step_interval = None  # seconds between its last two step changes, as seen here
        self.step_s = None  # the trainer's own recent step time, from its events
        self.status = None
        self.cause = None
        self.stopped = None  # who stopped it: "supervisor" or "outside"
        self.exited_at = None
        self.tail = []  # the last lines of its output, from its exit report (for the run's record)
        self.last_event = None  # its last step event (the metric summary in the run's record)
        self.paced = {}  # step -> (when it was seen here, its step time): its pace, for on_straggler


class Supervisor:
    def __init__(self, folder, plan, launch, webhook_url=None, clock=now):
        self.folder = folder
        self.plan = plan
        self.launch = launch  # the run's record (run_record.LaunchRecord), as launch wrote it once
        self.webhook = webhook.Webhook(webhook_url, launch.run_id, launch.node, self.decide) if webhook_url \
            else None
        self.clock = clock
        self.lock = threading.Lock()
        self.record_lock = threading.Lock()
        started = clock()
        self.workers = {w: WorkerView(w, started) for w in launch.workers}
        launched = launch.started()
        self.started_at = launched.timestamp() if launched is not None else started  # what max_cost counts
        self.attempt = 0
        self.restarts = {}  # class -> count
        self.stopping = None  # why every job is being stopped (cost, hang, fail-fast), or None
        self.restart_pending = None  # the class a restart is for, while the jobs stop
        self.ended = None  # the run's outcome once every job has ended
        self.delete_reason = None
        self.coordinator_port = None
        self.silent_told = False  # the run was said to look hung, and has not stepped since
        self.preemption = None  # the first preemption notice a runner reported (its JSON), passed to all
        self.told_notice = set()  # the workers whose runners were given it
        self.stragglers_told = set()  # (worker, attempt): each straggler is named once an attempt
        # a command job whose output is not read for steps (metrics format none) never reports one: its
        # silence says nothing, so it is judged neither hung nor past max_hang
        self.steps_read = launch.steps_read
        # observe/health.py's Thresholds, shipped in the plan (one home: the console's)
        self.thresholds = plan["thresholds"]

    # ---- what the job runners say ----------------------------------------------------------------

    def report(self, message):
        """A runner's report; returns the order for it (a dict)."""
        with self.lock:
            worker = self.workers.get(message.get("worker"))
            if worker is None:
                return {"order": DONE, "why": "not a worker of this run"}
            worker.last_seen = self.clock()
            event = message.get("event")
            attempt = int(message.get("attempt", 0))
            if event == "start":
                return self._on_start(worker, attempt)
            if event == "heartbeat":
                return self._on_heartbeat(worker, attempt, message.get("step"), message.get("step_s"))
            if event == "exit":
                return self._on_exit(worker, attempt, message)
            if event == "notice":
                return self._on_notice(worker, message.get("notice") or {})
            if event == "poll":
                return self._order_after_exit(worker)
            return {"order": RUN}

    def _on_start(self, worker, attempt):
        if attempt == self.attempt and worker.state in ("pending", "lost"):
            worker.state, worker.attempt, worker.progress_at = "running", attempt, self.clock()
        if self.preemption is not None and worker.index not in self.told_notice:
            return self._preempt(worker)
        if self.stopping or self.restart_pending:
            return {"order": STOP}
        return {"order": RUN}

    def _on_heartbeat(self, worker, attempt, step, step_s=None):
        if worker.state in ("pending", "lost") and attempt == self.attempt:
            worker.state = "running"
        if isinstance(step_s, (int, float)):
            worker.step_s = float(step_s)
        if step is not None and step != worker.step:
            if worker.step is not None:
                worker.step_interval = self.clock() - worker.progress_at
            worker.step, worker.progress_at = step, self.clock()
            worker.paced[step] = (self.clock(), worker.step_s)
            while len(worker.paced) > step_pace.kept_steps(self.plan.get("pace") or {}):
                del worker.paced[min(worker.paced)]
        if self.preemption is not None and worker.index not in self.told_notice:
            return self._preempt(worker)
        if self.stopping or self.restart_pending:
            return {"order": STOP}
        return {"order": RUN}

    def _on_exit(self, worker, attempt, message):
        if attempt != self.attempt or worker.state in ("exited", "done"):
            return self._order_after_exit(worker)
        worker.state, worker.exited_at = "exited", self.clock()
        worker.status, worker.cause = int(message.get("status", -1)), message.get("cause")
        worker.stopped = message.get("stopped")
        worker.tail = message.get("tail") or worker.tail
        worker.last_event = message.get("last_event") or worker.last_event
        if (worker.status != 0 and not worker.stopped and not self.stopping and not self.restart_pending
                and self.preemption is None):  # a peer gone with its VM is no failure of the job's
            self._on_failure(worker)
        return self._order_after_exit(worker)

    def _on_notice(self, worker, notice):
        """A runner saw its VM going: every job is to checkpoint now, and the run ends preempted."""
        self.told_notice.add(worker.index)
        if self.preemption is not None:
            return {"order": RUN}
        self.preemption = {**notice, "worker": worker.index}
        others = [w.index for w in self.workers.values()
                  if w.index != worker.index and w.state in ("pending", "running")]
        left = notice.get("seconds_left")
        self.decide("preemption-notice", f"worker {worker.index}: {notice.get('source', 'preempted')} "
                    f"({notice.get('value')}), {left if left is not None else '?'}s left: its job has "
                    "SIGTERM to checkpoint" + (f"; passing the notice to worker(s) {_join(others)}"
                                               if others else ""), notice=self.preemption)
        self.notify("preempted", f"preemption notice on worker {worker.index} "
                    f"({notice.get('source', 'preempted')}): every job checkpoints and stops")
        return {"order": RUN}

    def _preempt(self, worker):
        self.told_notice.add(worker.index)
        return {"order": PREEMPT, "notice": self.preemption}

    def on_sigterm(self):
        """SIGTERM to the supervisor. The VM going down (after a preemption notice, or systemd stopping
        everything) ends the run `preempted`, recorded before the VM goes; True then. Any other SIGTERM
        stops the supervisor alone: False."""
        going = self.preemption is not None or (
            preemption_notice is not None and preemption_notice.system_going_down())
        if not going:
            return False
        with self.lock:
            if self.ended is None:
                self.preemption = self.preemption or {"source": "shutdown", "value": "SIGTERM"}
                self.ended = "preempted"
                self.decide("ended", "the run preempted: the VM is shutting down", outcome="preempted")
        self.save_record()
        return True

    def _order_after_exit(self, worker):
        if worker.state == "done":
            return {"order": DONE, "status": worker.status}
        if self.restart_pending:
            return {"order": WAIT}
        if self.attempt > worker.attempt and worker.state == "exited":
            worker.attempt, worker.state, worker.progress_at = self.attempt, "running", self.clock()
            worker.status = worker.cause = worker.stopped = None
            worker.paced = {}  # a new attempt's pace starts afresh
            order = {"order": RESTART, "attempt": self.attempt}
            if self.coordinator_port:
                order["coordinator_port"] = self.coordinator_port
            return order
        if worker.state == "exited":
            worker.state = "done"
            return {"order": DONE, "status": worker.status}
        return {"order": RUN}

    # ---- decisions --------------------------------------------------------------------------------

    def _on_failure(self, worker):
        """Worker `worker`'s job failed on its own: restart the run, stop the others, or note it."""
        cause = worker.cause or "unknown"
        what = f"worker {worker.index} exited {worker.status}" + (f" ({cause})" if worker.cause else "")
        classes = self.plan.get("restart_on") or []
        never = [w.index for w in self.workers.values()
                 if w.state == "exited" and w.status and not w.stopped and w.cause not in classes]
        if cause in classes and not never and not self._lost():
            used = self.restarts.get(cause, 0)
            if used < int(self.plan.get("max_restarts", 0)):
                self.restarts[cause] = used + 1
                self.restart_pending = cause
                self.decide("restart", f"{what}: restarting every job from its latest checkpoint "
                            f"({cause} restart {used + 1} of {self.plan['max_restarts']})", cause=cause)
                return
            self.decide("not-restarted", f"{what}: no {cause} restart left "
                        f"({used} of {self.plan['max_restarts']} used)", cause=cause)
        elif classes:
            self.decide("not-restarted", f"{what}: a {cause} failure is never restarted", cause=cause)
        # a worker whose runner has not reported yet is stopped as soon as it does
        others = [w.index for w in self.workers.values() if w.state in ("pending", "running")]
        if (self.launch.fail_fast or classes) and others:
            self.stopping = "fail-fast"
            self.decide("stop-others", f"{what}: stopping worker(s) {_join(others)} "
                        "(they would wait in a collective)", workers=others)
        else:
            self.decide("worker-failed", what)
            if others:
                self.notify("hung", f"{what}; worker(s) {_join(others)} still run and will likely hang in a "
                            "collective: stop them (tpu-console stop)")

    def _lost(self):
        return [w.index for w in self.workers.values() if w.state == "lost"]

    def tick(self):
        """The supervisor's own clock work: lost workers, a restart's second half, budget, hang, the end."""
        with self.lock:
            t = self.clock()
            lost_after = float(self.plan.get("lost_after_s", 60))
            for w in self.workers.values():
                if w.state == "exited" and t - w.last_seen > lost_after:
                    w.state = "done"  # its runner stopped asking what next: it has ended
                if w.state in ("pending", "running") and t - w.last_seen > lost_after:
                    w.state, w.exited_at = "lost", t
                    self.decide("worker-lost", f"worker {w.index}'s job runner has not reported for "
                                f"{t - w.last_seen:.0f}s: the worker is lost")
                    if not self.stopping and not self.restart_pending and self.preemption is None:
                        others = [o.index for o in self.workers.values() if o.state in ("pending", "running")]
                        if others and (self.launch.fail_fast or self.plan.get("restart_on")):
                            self.stopping = "fail-fast"
                            self.decide("stop-others", f"stopping worker(s) {_join(others)} after worker "
                                        f"{w.index} was lost", workers=others)
            ended = all(w.state in ("exited", "lost", "done") for w in self.workers.values())
            if self.restart_pending and ended:
                if self._lost():
                    self.decide("not-restarted", f"worker(s) {_join(self._lost())} lost: their jobs cannot "
                                "be started again from here")
                    self.restart_pending = None
                    for w in self.workers.values():
                        if w.state == "exited":
                            w.stopped = w.stopped or "supervisor"
                else:
                    cause, self.restart_pending = self.restart_pending, None
                    self.attempt += 1
                    if self.plan.get("coordinator_host"):
                        self.coordinator_port = _free_port(self.plan["coordinator_host"])
                    self.notify("restarted", f"restarted ({cause}, attempt {self.attempt + 1})")
            if self.ended is None and not self.stopping and not self.restart_pending and not self.preemption:
                self._check_budget(t)
                self._check_hang(t)
                self._check_stragglers()
            if self.ended is None and all(w.state in ("done", "lost") for w in self.workers.values()):
                self._end()

    def _check_budget(self, t):
        budget, price = self.plan.get("max_cost"), self.launch.price_per_hour
        if budget is None or price is None:
            return
        cost = price * (t - self.started_at) / 3600.0
        if cost >= budget:
            self._stop_and_delete("max-cost", f"the run has cost ~${cost:.2f} of its ${budget:g} budget "
                                  f"(at ${price:g}/h): stopping it and deleting the node")

    def _check_hang(self, t):
        running = [w for w in self.workers.values() if w.state == "running"]
        if not running or not self.steps_read:
            return
        # As observe/health.py judges it, with its thresholds: a stall is no new step for stall_factor step
        # times, and at least stall_floor_s; a job with no step yet is loading or compiling until silent_s.
        limits = self.thresholds
        silent_s, floor_s, factor = (float(limits[k]) for k in ("silent_s", "stall_floor_s", "stall_factor"))
        silent = all(t - w.progress_at > (silent_s if w.step is None else max(
            floor_s, factor * (w.step_s or w.step_interval or 0))) for w in running)
        if silent and not self.silent_told:
            self.silent_told = True
            self.decide("silent", "every worker stopped making steps: the run looks hung")
            if self.plan.get("max_hang_s") is None:
                self.notify("hung", "hung: every worker stopped making steps (`tpu-console stacks` shows "
                            "where)")
        elif not silent:
            self.silent_told = False
        limit = self.plan.get("max_hang_s")
        if limit is None:
            return
        # A first compile may take longer than the limit: before its first step a job gets silent_s.
        if all(t - w.progress_at >= (limit if w.step is not None else max(limit, silent_s)) for w in running):
            steps = ", ".join(f"{w.index}@{w.step if w.step is not None else '-'}" for w in running)
            self.notify("hung", f"hung: no worker made a step for {_duration(limit)}")
            self._stop_and_delete("max-hang", f"no worker made a step for {_duration(limit)} (worker@step: "
                                  f"{steps}): stopping the run and deleting the node")

    def _check_stragglers(self):
        """on_straggler: name a straggler (step_pace.py's rule) once an attempt; restart, when asked to."""
        action = self.plan.get("on_straggler")
        if action not in ("report", "restart"):
            return
        paced = {w.index: w.paced for w in self.workers.values() if w.state == "running"}
        slow = step_pace.stragglers(paced, self.plan.get("pace") or {})
        for index, (seconds, median, steps) in sorted(slow.items()):
            if (index, self.attempt) in self.stragglers_told:
                continue
            self.stragglers_told.add((index, self.attempt))
            what = (f"worker {index}: {seconds / median:.1f}x the median step for the last {steps} steps "
                    f"({seconds:.2f}s vs {median:.2f}s)")
            used, allowed = self.restarts.get("straggler", 0), int(self.plan.get("max_restarts", 0))
            if action == "restart" and used < allowed:
                self.restarts["straggler"] = used + 1
                self.restart_pending = "straggler"
                self.decide("straggler", f"{what}: restarting every job from its latest checkpoint "
                            f"(straggler restart {used + 1} of {allowed})", worker=index, action="restart")
                self.notify("straggler", f"straggler: {what}; restarting the run")
                return
            note = (f"no straggler restart left ({used} of {allowed} used)" if action == "restart"
                    else "reported")
            self.decide("straggler", f"{what}: {note}", worker=index, action="report")
            self.notify("straggler", f"straggler: {what}")

    def _stop_and_delete(self, why, message):
        self.stopping, self.delete_reason = why, why
        self.decide(why, message)

    def _end(self):
        workers = self.workers.values()
        if self.stopping in ("max-cost", "max-hang"):
            outcome = "stopped"
        elif self.preemption is not None:
            outcome = "preempted"  # whatever the jobs' statuses: told to stop, they did not finish
        elif all(w.status == 0 for w in workers):
            outcome = "succeeded"
        elif any(w.stopped == "outside" for w in workers) and not any(
                w.status and not w.stopped for w in workers):
            outcome = "stopped"
        else:
            outcome = "failed"
        self.ended = outcome
        statuses = ", ".join(f"{w.index}:{'lost' if w.state == 'lost' else w.status}" for w in workers)
        self.decide("ended", f"the run {outcome} (exit status by worker {statuses})", outcome=outcome)
        if outcome in ("succeeded", "failed"):
            failed = [w for w in workers if w.status and not w.stopped]
            why = f": worker {failed[0].index} exited {failed[0].status}" if failed else ""
            self.notify(outcome, f"{outcome}{why}")
        if self.plan.get("on_end") == "delete" and self.delete_reason is None:
            self.delete_reason = "on-end"

    # ---- the decisions file, notifications ----------------------------------------------------------

    def decide(self, decision, message, **fields):
        record = {"t": round(self.clock(), 3), "decision": decision, "message": message, **fields}
        with self.record_lock:
            try:
                with open(os.path.join(self.folder, DECISIONS_FILE), "a") as out:
                    out.write(json.dumps(record) + "\n")
            except OSError:
                pass  # the run folder went with the node
        print(f"{decision}: {message}", flush=True)

    def notify(self, event, text, wait=False):
        """One webhook message (webhook.py), when a webhook is set up."""
        if self.webhook is not None:
            self.webhook.send(event, text, wait)

    # ---- the run's record: outlives the node ---------------------------------------------------------

    def record(self):
        """The run's record for the bucket (bucket_writer.py): as launched, the decisions, how it ended, and
        each worker's exit status, last step event and last lines of output."""
        try:
            with open(os.path.join(self.folder, DECISIONS_FILE)) as f:
                decisions = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            decisions = []
        workers = {w.index: {"state": w.state, "exit_status": w.status, "cause": w.cause,
                             "stopped": w.stopped, "step": w.step, "step_s": w.step_s,
                             "last_event": w.last_event, "tail": w.tail} for w in self.workers.values()}
        return bucket_writer.build(
            self.launch, decisions, workers, os.path.join(self.folder, ".env"),
            int((self.plan.get("record") or {}).get("mask_min_length", 1)), written_at=round(self.clock(), 3),
            outcome=self.ended, reason=self.delete_reason, restarts=dict(self.restarts))

    def save_record(self):
        """Write the record where the plan says (a bucket, or the folder standing for one); a failure is
        a decision of its own, never the end of the supervisor."""
        target = self.plan.get("record")
        if not target:
            return
        try:
            where = bucket_writer.write(target, self.record())
        except Exception as exc:  # noqa: BLE001 - whatever failed, say so in the decisions
            self.decide("record-failed", f"the run's record was not written to {bucket_writer.place(target)} "
                        f"({type(exc).__name__}: {exc})")
            return
        print(f"record: {where}", flush=True)


def supervise(folder, supervisor):
    """Tick until the run has ended, then delete the node when the plan or a budget says so."""
    plan, node = supervisor.plan, supervisor.launch.node
    while supervisor.ended is None:
        if not os.path.isdir(folder):
            return  # the node was deleted under us
        supervisor.tick()
        time.sleep(TICK_S)
    supervisor.save_record()
    if supervisor.delete_reason is None:
        return
    if supervisor.delete_reason == "on-end":
        grace = float(plan.get("grace_s", 0))
        supervisor.decide("delete-scheduled", f"deleting the node in {_duration(grace)} unless a newer run "
                          "starts on it")
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        newer = node_deletion.newer_run(folder)
        if newer:
            supervisor.decide("kept", f"a newer run ({newer}) started on the node: it is not deleted")
            return
    supervisor.decide("deleting", f"deleting node {node} ({supervisor.delete_reason})")
    supervisor.save_record()  # before the node and its run folders are gone: how it ended, and why
    supervisor.notify("deleted", f"node {node} deleted by the supervisor "
                      f"({supervisor.delete_reason})", wait=True)
    try:
        node_deletion.delete_node(plan.get("delete"), supervisor.launch.provider)
    except Exception as exc:  # noqa: BLE001 - whatever failed, say so in the record
        detail = f"{type(exc).__name__}: {exc}"
        if os.path.isdir(folder):
            supervisor.decide("delete-failed", f"could not delete node {node}: {detail}")
            supervisor.save_record()
        print(f"delete failed: {detail}", flush=True)
        return
    if os.path.isdir(folder):  # on a local pod the folder went with the node
        supervisor.decide("deleted", f"node {node} deleted")


def main(argv):
    folder = os.path.abspath(argv[0] if argv else ".")
    with open(os.path.join(folder, PLAN_FILE)) as f:
        plan = json.load(f)
    try:  # the run's own facts: launch wrote its record before it started this supervisor
        launch = run_record.load(folder)
    except run_record.RecordError as exc:
        sys.exit(f"error: {exc}")
    if not launch.workers:
        sys.exit(f"error: {run_record.FILE} of run {launch.run_id} names no workers to supervise; launch the "
                 "run again")
    supervisor = Supervisor(folder, plan, launch, webhook.read_url(folder))

    def on_sigterm(signum, frame):
        supervisor.on_sigterm()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    server = report_server.serve(folder, supervisor.report, plan["token"], plan.get("bind", "127.0.0.1"))
    supervisor.decide("started", f"supervising {len(launch.workers)} worker(s): "
                      + describe(plan, launch.fail_fast))
    try:
        supervise(folder, supervisor)
    finally:
        server.shutdown()


def describe(plan, fail_fast):
    parts = ["fail-fast" if fail_fast else "no fail-fast"]
    if plan.get("restart_on"):
        parts.append(f"restart on {','.join(plan['restart_on'])} up to {plan['max_restarts']} each")
    if plan.get("on_end") == "delete":
        parts.append(f"delete the node {_duration(plan.get('grace_s', 0))} after the run ends")
    if plan.get("max_cost") is not None:
        parts.append(f"max cost ${plan['max_cost']:g}")
    if plan.get("max_hang_s") is not None:
        parts.append(f"max hang {_duration(plan['max_hang_s'])}")
    return ", ".join(parts)


# ---- small helpers --------------------------------------------------------------------------------


def _free_port(host):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _join(workers):
    return ",".join(str(w) for w in workers)


def _duration(seconds):
    seconds = float(seconds)
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


if __name__ == "__main__":
    main(sys.argv[1:])
