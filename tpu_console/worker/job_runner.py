"""A worker's side of the run's supervision: runs the job and reports it to the supervisor (supervisor.py).

The launch wrapper (job_wrapper.sh) starts `python3 job_runner.py -- COMMAND...` in the run folder as the
job, so the runner leads the job's process group: `stop` still ends everything with one group signal, and
the wrapper's `exit` file holds the job's own exit status (128+N for signal N), written once, when the
runner gives up the job for good.

The runner starts COMMAND (its pid in `job.pid`, which `tpu-console stacks` signals), then reports to the
supervisor at `$TPU_CONSOLE_SUPERVISOR` (host:port, on the pod's network) over HTTP: `start`; a
`heartbeat` every `heartbeat_s` with the last step of its `events.jsonl`; `exit` with the status and the
failure's class, read from this attempt's part of `output.log` with the console's log signatures (the
patterns come in `supervision.json`, written by `launch` from tpu_console/observe/signatures.py). Each answer
is an order: carry on, stop the job (SIGTERM to the job's group, SIGKILL to the job after `stop_grace_s`),
start it again (a restart: the trainer resumes from its latest checkpoint; on pods where the console names
the coordinator, on a new port), wait, or be done. A supervisor that does not answer changes nothing: the
job runs, and its status is the runner's.

A command job (launch.json's "job" of kind "command": a program that knows nothing of tpu-console) writes
no events of its own: the runner reads its `output.log` as it grows and appends a step event to
`events.jsonl` for each step line it recognises (step_lines.py, shipped beside it; the format is the job's
"metrics" "format"), so the heartbeat, the console's views and the history read it as they read the trainer.

Python 3.8+ and the standard library only; it imports nothing of the console.
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

try:  # shipped beside this file into the run folder (launch/start.py)
    import step_lines
except ImportError:  # a run folder without it: a command job's steps are not read
    step_lines = None
try:  # shipped beside this file too: the VM's preemption notice, passed to the job
    import preemption_notice
except ImportError:
    preemption_notice = None
try:  # shipped beside this file too: the time a log line gives itself, which times steps exactly
    import log_timestamps
except ImportError:  # steps are timed by when their lines are read
    log_timestamps = None
try:  # shipped beside this file too: launch.json's one schema
    import run_record
except ImportError:  # imported as tpu_console.worker.job_runner (the console's tests)
    from tpu_console.worker import run_record

PLAN_FILE = "supervision.json"
ADDRESS_ENV = "TPU_CONSOLE_SUPERVISOR"
JOB_PID_FILE = "job.pid"
COORDINATOR_ENV = "TRAINER_COORDINATOR_ADDRESS"
# A command job's coordinator (launch/start.py, coordinator_env): each moves to the restart's new port.
COORDINATOR_ENVS = (COORDINATOR_ENV, "JAX_COORDINATOR_ADDRESS", "TPU_CONSOLE_COORDINATOR_ADDRESS")
PORT_ENV = "MASTER_PORT"
# Rich (Lightning's progress bar, any program's live display) draws into a file only once, at its end: these
# tell it the output takes a terminal's escape sequences, so it redraws as it goes, each redraw a line that
# step_lines.py reads (tqdm redraws into a file anyway). The job's own setting of them wins.
TERMINAL_ENV = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
EXIT_BAD_INPUT = 2  # the trainer's status for a config it refuses
TRACEBACK_START = "Traceback (most recent call last):"
# How often a command job's new output is read for step lines, and so how well a step whose line gives no
# time is timed by when it came: every READ_STEPS_S, and every READ_FLOWING_S while the output grew in the
# last FLOWING_S (a loop of 60 ms steps read every 0.1 s was timed 11% off).
READ_STEPS_S = 0.1
READ_FLOWING_S = 0.02
FLOWING_S = 1.0
LOG_TIMES_S = 0.5  # how often output.log's growth is noted in output.times (a line a look, at most)
NO_ANSWER_S = 5.0  # after its job ended, how long the runner waits for a supervisor that does not answer
PREEMPTED = "preempted"  # the failure class (and `stopped`) of a job ended by a preemption notice
KILL_AFTER_DEADLINE_S = 5.0


class Classifier:
    """The class of a failure from a log, as the console's SignatureScanner judges it: the first line
    that matches a specific signature, else a Python traceback (`exception`), else a refused config."""

    def __init__(self, signatures, trainer=True):
        self.signatures = [(kind, re.compile(pattern)) for kind, pattern in signatures]
        # exit 2 is the trainer's refused config; from any other program it says nothing we know
        self.trainer = trainer

    def classify(self, path, offset, status):
        found, traceback = None, False
        try:
            with open(path, "rb") as log:
                log.seek(offset)
                for raw in log:
                    line = raw.decode("utf-8", "replace")
                    if line.startswith(TRACEBACK_START):
                        traceback = True
                    for kind, pattern in self.signatures:
                        if pattern.search(line):
                            found = kind
                            break
                    if found:
                        break
        except OSError:
            pass
        if found:
            return found
        if traceback:
            return "exception"
        if status == EXIT_BAD_INPUT and self.trainer:
            return "config"
        return None


class Runner:
    def __init__(self, command, plan, worker, address, env=None, job=None, watch_metadata=False):
        self.command = command
        self.plan = plan
        self.worker = worker
        self.address = address
        self.env = dict(os.environ if env is None else env)
        self.env = {**TERMINAL_ENV, **self.env}
        self.attempt = 0
        self.job = None
        self.stopped = None  # "supervisor" when ordered to stop, "outside" when signalled by someone else
        self.ordered_stop = False
        is_command = isinstance(job, dict) and job.get("kind") == "command"
        self.classifier = Classifier(plan.get("signatures", []), trainer=not is_command)
        self.step = None
        self.step_s = None
        self.last_event = None  # the last step event: the metric summary of the supervisor's run record
        self.events_offset = _size("events.jsonl")
        self.steps = StepFeed.for_job(job, worker)
        self.log_times = LogTimes()
        # a command runs in its project's folder (launch.json's job "cwd", under the home); the trainer here
        command_job = isinstance(job, dict) and job.get("kind") == "command" and job.get("cwd")
        self.cwd = os.path.join(os.path.expanduser("~"), job["cwd"]) if command_job else None
        self.notice = None  # the preemption notice passed to the job (preemption_notice.Notice)
        self.notice_lock = threading.Lock()
        self.watch = None
        if preemption_notice is not None:
            # where the job reads the notice: named at start, since a running process's environment is fixed
            self.notice_file = os.path.abspath(preemption_notice.PREEMPTION_FILE)
            self.env[preemption_notice.PREEMPTION_FILE_ENV] = self.notice_file
            if watch_metadata or self.env.get(preemption_notice.METADATA_HOST_ENV):
                self.watch = preemption_notice.NoticeWatch(self.pass_notice,
                                                           preemption_notice.metadata_base(self.env))

    # ---- talking to the supervisor -----------------------------------------------------------------

    def report(self, event, **fields):
        """POST one report; the supervisor's order, or None when it does not answer."""
        if not self.address:
            return None
        body = {"token": self.plan.get("token"), "worker": self.worker, "attempt": self.attempt,
                "event": event, **fields}
        request = urllib.request.Request(f"http://{self.address}/report", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return json.loads(answer.read().decode())
        except (OSError, ValueError):
            return None

    # ---- the job ---------------------------------------------------------------------------------------

    def start(self):
        self.stopped, self.ordered_stop = None, False
        self.log_offset = _size("output.log")
        if preemption_notice is not None and self.notice is None and os.path.exists(self.notice_file):
            os.remove(self.notice_file)  # an earlier run's notice in a reused folder is not this job's
        try:
            self.job = subprocess.Popen(self.command, env=self.env, cwd=self.cwd)
        except OSError as exc:  # no such program (or folder): one line and a shell's status, no traceback
            print(f"tpu-console: cannot start {self.command[0]}: {exc.strerror}", flush=True)
            status = 127 if isinstance(exc, FileNotFoundError) else 126
            self.job = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({status})"])
        with open(JOB_PID_FILE + ".tmp", "w") as out:
            out.write(f"{self.job.pid}\n")
        os.replace(JOB_PID_FILE + ".tmp", JOB_PID_FILE)
        self.react(self.report("start"))

    def stop(self):
        """The supervisor's stop: SIGTERM to the job's group (this runner survives it), SIGKILL to the job
        after the grace."""
        if self.ordered_stop or self.job.poll() is not None:
            return
        self.ordered_stop, self.stopped = True, "supervisor"
        print(f"tpu-console supervisor: stopping worker {self.worker}'s job", flush=True)
        try:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        except OSError:
            self.job.terminate()
        try:
            self.job.wait(float(self.plan.get("stop_grace_s", 10)))
        except subprocess.TimeoutExpired:
            self.job.kill()

    def on_term(self, signum, frame):
        if self.ordered_stop or self.notice is not None:
            return  # our own group signal
        if preemption_notice is not None and preemption_notice.system_going_down():
            self.pass_notice(preemption_notice.Notice("shutdown", "SIGTERM"))  # the VM's shutdown
        else:
            self.stopped = "outside"  # `tpu-console stop`: the job got it too

    def pass_notice(self, notice):
        """The VM is going away: tell the job at once (the notice file, then SIGTERM to the job's group, so
        it checkpoints), add a `preemption` event to events.jsonl, and tell the supervisor, which passes it
        to the other workers. Once per job; called from the watch's thread, a signal handler or a report."""
        with self.notice_lock:
            if self.notice is not None or self.job is None or self.job.poll() is not None:
                return
            self.notice, self.stopped = notice, PREEMPTED
        notice.write(self.notice_file)
        event = {"t": round(time.time(), 3), "kind": "preemption", "process": self.worker, **notice.to_json()}
        with open("events.jsonl", "a") as out:
            out.write(json.dumps(event) + "\n")
        print(f"tpu-console: preemption notice: {notice.describe()}; SIGTERM to worker {self.worker}'s job "
              "so it checkpoints", flush=True)
        try:
            if os.getpgrp() != os.getpid():
                raise OSError("not the group's leader")  # started by hand: the job alone, never our parent's
            os.killpg(os.getpgrp(), signal.SIGTERM)
        except OSError:
            self.job.terminate()
        if notice.worker is None:  # seen here: the supervisor passes it on
            self.report("notice", notice=notice.to_json())

    def react(self, answer):
        if answer and answer.get("order") == "stop":
            self.stop()
        elif answer and answer.get("order") == "preempt" and preemption_notice is not None:
            self.pass_notice(preemption_notice.Notice.from_json(answer.get("notice") or {}))

    def read_step(self):
        """The last step number in events.jsonl's new lines."""
        try:
            with open("events.jsonl", "rb") as events:
                events.seek(self.events_offset)
                data = events.read()
        except OSError:
            return
        end = data.rfind(b"\n") + 1
        self.events_offset += end
        for line in data[:end].splitlines():
            if b'"step"' not in line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("kind") == "step" and isinstance(event.get("step"), int):
                self.step, self.last_event = event["step"], event
                # the trainer's own step time, which the supervisor's stall judgement scales with
                recent = event.get("time/train/step_avg_last10_s") or event.get("time/train/step_s")
                self.step_s = recent if isinstance(recent, (int, float)) else self.step_s

    def wait_job(self):
        heartbeat = float(self.plan.get("heartbeat_s", 2))
        next_beat = time.monotonic() + heartbeat
        next_read = time.monotonic() + READ_STEPS_S
        grew_at = -math.inf
        while self.job.poll() is None:
            time.sleep(max(0.001, min(0.1, heartbeat, next_read - time.monotonic())))
            if self.notice is not None and time.time() > self.notice.deadline + KILL_AFTER_DEADLINE_S:
                self.job.kill()  # the VM would be gone by now (a pod that stays, as a local one, goes on)
            if time.monotonic() >= next_read:
                if self.steps is not None and self.steps.read():
                    grew_at = time.monotonic()
                self.log_times.note()
                flowing = time.monotonic() - grew_at < FLOWING_S
                next_read = time.monotonic() + (READ_FLOWING_S if flowing else READ_STEPS_S)
            if time.monotonic() >= next_beat:
                self.read_step()
                self.react(self.report("heartbeat", step=self.step, step_s=self.step_s))
                next_beat = time.monotonic() + heartbeat
        if self.steps is not None:
            self.steps.read(final=True)
        self.log_times.note(final=True)
        code = self.job.returncode
        return 128 - code if code < 0 else code

    def run(self):
        if self.watch is not None:
            self.watch.start()
        while True:
            self.start()
            status = self.wait_job()
            cause = self.classifier.classify("output.log", self.log_offset, status) if status else None
            if self.notice is not None:
                cause = PREEMPTED  # whatever the job printed on its way out
            self.read_step()
            tail_lines = (self.plan.get("record") or {}).get("tail_lines", 0)  # for the run's record
            answer = self.report("exit", status=status, cause=cause, stopped=self.stopped,
                                 tail=_tail("output.log", tail_lines), last_event=self.last_event)
            unanswered_since = None
            while (answer or {}).get("order") != "restart":
                if (answer or {}).get("order") == "done":
                    return status
                if answer is None:  # the supervisor is gone (or the network blinked): do not hold `exit`
                    unanswered_since = unanswered_since or time.monotonic()
                    if time.monotonic() - unanswered_since > NO_ANSWER_S:
                        return status
                else:
                    unanswered_since = None
                time.sleep(0.2)
                answer = self.report("poll")
            self.restart(answer)

    def restart(self, order):
        self.attempt = int(order["attempt"])
        port = order.get("coordinator_port")
        for name in COORDINATOR_ENVS if port else ():
            if self.env.get(name):
                host = self.env[name].rsplit(":", 1)[0]
                self.env[name] = f"{host}:{port}"
        if port and self.env.get(PORT_ENV):
            self.env[PORT_ENV] = str(port)
        print(f"tpu-console supervisor: starting worker {self.worker}'s job again (attempt "
              f"{self.attempt + 1})", flush=True)


class LogTimes:
    """When output.log grew: `output.times` gets a line `<size> <unix time>` when the log is longer than at
    the last look, every LOG_TIMES_S at most, so a reader knows when each line was written, to within that
    (the dashboard interleaves the workers' lines by it). output.log itself holds the program's bytes only."""

    def __init__(self, log="output.log", path="output.times"):
        self.log = log
        self.path = path
        self.size = _size(log)
        self.next_look = 0.0

    def note(self, final=False):
        if time.monotonic() < self.next_look and not final:
            return
        self.next_look = time.monotonic() + LOG_TIMES_S
        size = _size(self.log)
        if size > self.size:
            self.size = size
            with open(self.path, "a") as out:
                out.write(f"{size} {time.time():.3f}\n")


class StepFeed:
    """A command job's step lines, from its output.log into events.jsonl (complete lines only; a line cut
    off at the end waits for the rest, unless the job has ended, when StepLines also gives what it held).
    A step is timed by the time its line gives itself where it gives one (log_timestamps.py), since lines
    read together (every READ_STEPS_S, or READ_FLOWING_S) came at once."""

    def __init__(self, parser, log="output.log", events="events.jsonl"):
        self.parser = parser
        self.log = log
        self.events = events
        self.offset = _size(log)  # what came before this runner (an earlier launch's lines) is not this job's

    @classmethod
    def for_job(cls, job, worker):
        """The feed launch.json's "job" asks for: None for the trainer (it writes its own events), for a
        format of "none", or when step_lines.py did not come with the runner."""
        if not isinstance(job, dict) or job.get("kind") != "command" or step_lines is None:
            return None
        metrics = job.get("metrics") or {}
        try:
            parser = step_lines.StepLines(metrics.get("format") or "auto", metrics.get("regex"), worker)
        except ValueError as exc:  # refused by launch already; a hand-made launch.json gets a line in the log
            print(f"tpu-console: step lines are not read: {exc}", flush=True)
            return None
        return None if parser.format == "none" else cls(parser)

    def read(self, final=False):
        """Read what the log gained; True when it gained anything."""
        try:
            with open(self.log, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except OSError:
            return False
        # each state of a redrawn progress bar (\r, \b) is a line; StepLines counts a redrawn step once
        lines, used = step_lines.complete_lines(data, final)
        self.offset += used
        events = []
        for line in lines:
            written = log_timestamps.timestamp(line) if log_timestamps else None  # its own, where it says
            events += self.parser.feed(line, written=written)
        if final:  # the attempt ended: a bar's open step is done, and a restart counts afresh
            events += self.parser.finish()
        else:  # a bar that stopped moving: its step is not held back longer
            events += self.parser.idle()
        if events:
            with open(self.events, "a") as out:
                out.write("".join(json.dumps(event) + "\n" for event in events))
        return bool(data)


def _tail(path, lines):
    """The last `lines` lines of a file (its last 16 KiB at most), for the supervisor's run record."""
    if not lines:
        return []
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 16384))
            data = f.read()
    except OSError:
        return []
    return [line.rstrip("\r") for line in data.decode("utf-8", "replace").splitlines()[-lines:]]


def _size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def main(argv):
    if "--" not in argv:
        sys.exit("usage: job_runner.py -- COMMAND [ARG...]")
    command = argv[argv.index("--") + 1:]
    command[0] = os.path.expanduser(command[0])
    try:
        with open(PLAN_FILE) as f:
            plan = json.load(f)
    except (OSError, ValueError):
        plan = {}
    launch = run_record.read(".")
    worker = launch.worker if launch is not None and launch.worker is not None else 0
    # a Cloud TPU VM has a metadata server to watch for its preemption; elsewhere only $GCE_METADATA_HOST
    runner = Runner(command, plan, worker, os.environ.get(ADDRESS_ENV), job=launch and launch.job,
                    watch_metadata=launch is not None and launch.provider == "gcp")
    signal.signal(signal.SIGTERM, runner.on_term)
    signal.signal(signal.SIGINT, runner.on_term)
    # `stacks` signals the job, not the runner; a stray SIGUSR1 sent to the group must not end the runner.
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    sys.exit(runner.run())


if __name__ == "__main__":
    main(sys.argv[1:])
