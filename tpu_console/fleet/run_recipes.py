"""Shell recipes for a run's folder on a worker: prepare, start detached, stop, probe, tail.

Each function returns the text of one bash command, built with `shlex.quote` from data, so it can be
tested without a worker and read in one place. Every recipe runs in a subshell `( ... )`, so recipes can
be joined with `;` into one round trip. The files they read and write are the worker-side contract of
docs/contract.md: `~/tpu-console/runs/<run_id>/{launch.json, config.yaml, .env, output.log, events.jsonl,
pid, exit}`.

Stopping a job never relies on SSH channel signals (sshd ignores them for non-pty sessions, and the job
is detached anyway): the wrapper records the job's process group and `stop` kills that group.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from tpu_console import worker
from tpu_console.fleet.program import PythonProgram
from tpu_console.worker import libtpu_probe

RUNS_DIR = "tpu-console/runs"  # relative to the worker's home
# Separates the sections of a probe's output: a control character no JSON line holds unescaped.
MARK = "\x1e"
_MARK_PRINTF = "\\036"  # MARK as printf writes it, so the command text itself stays printable
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def run_dir(run_id: str) -> str:
    """The run's folder relative to the worker's home (what SFTP paths use)."""
    return f"{RUNS_DIR}/{run_id}"


def _home_path(relative: str) -> str:
    """A quoted shell word for `~/relative` that expands $HOME but nothing in `relative`."""
    return '"$HOME"/' + shlex.quote(relative)


def python_word(python: str) -> str:
    """The interpreter as a shell word: `~/venv/bin/python` expands the home, anything else is quoted."""
    if python.startswith("~/"):
        return _home_path(python[2:])
    return shlex.quote(python)


def check_inputs(inputs: Sequence[tuple[str, str, str]]) -> str:
    """For (key, path, need) with need `exists`, `file` or `writable`: `@@ input missing KEY` for a path
    that is not there, `@@ input unwritable KEY` for a folder the job could not write (its nearest
    existing parent is not a writable folder). Changes nothing on the worker."""
    lines = ["("]
    for key, path, need in inputs:
        word, mark = python_word(path), shlex.quote(key)
        if need == "writable":
            lines.append(
                f'd={word}; while [ ! -e "$d" ] && [ "$d" != / ]; do d=$(dirname "$d"); done; '
                f'{{ [ -d "$d" ] && [ -w "$d" ]; }} || echo "@@ input unwritable "{mark}'
            )
        else:
            test = "-f" if need == "file" else "-e"
            lines.append(f'[ {test} {word} ] || echo "@@ input missing "{mark}')
    lines.append("exit 0 )")
    return "\n".join(lines)


def make_tiny_inputs(python: str, model_path: str, data_path: str) -> str:
    """The offline demo's inputs where missing: a tiny random Qwen2 at `model_path` and synthetic
    GSM8K-format problems at `data_path`, made by the trainer installed on the worker. Prints `@@ step`
    lines, and `@@ error` (exit 1) when the worker's Python has no trainer or making one failed."""
    py = python_word(python)
    made = []
    for path, verb, what in ((model_path, "make-tiny-model", "the tiny model"),
                             (data_path, "make-gsm8k-jsonl", "synthetic GSM8K data")):
        word, shown = python_word(path), shlex.quote(path)
        test = "-e" if verb == "make-tiny-model" else "-f"
        made.append(
            f'if [ {test} {word} ]; then echo "@@ step {what}: already at "{shown}; '
            f'else out=$({py} -m trainer {verb} {word} 2>&1) || {{ printf "%s\\n" "$out" | tail -n 3; '
            f'echo "@@ error could not make {what} at "{shown}; exit 1; }}; '
            f'echo "@@ step {what}: made at "{shown}; fi'
        )
    return "\n".join([
        f"( if ! {py} -c 'import trainer' 2>/dev/null; then "
        'echo "@@ error the Python of this worker has no trainer: sync the code first"; exit 1; fi',
        *made,
        "exit 0 )",
    ])


def prepare_run_dir(run_id: str, copy_env_from: str | None = None) -> str:
    """Make the run folder (private to the user); fail if a run with this id already exists there.

    `copy_env_from` (relative to the home): a `.env` left by `sync` to copy into the run, mode 0600, when
    it exists; prints `env=synced` then. The copy stays on the worker: no secret crosses the wire here."""
    d = _home_path(run_dir(run_id))
    copy = ""
    if copy_env_from:
        src = _home_path(copy_env_from)
        copy = f'; if [ -f {src} ]; then cp {src} "$d/.env" && chmod 600 "$d/.env" && echo env=synced; fi'
    return (
        f'( d={d}; if [ -e "$d" ]; then echo "run folder $d already exists" >&2; exit 3; fi; '
        f'umask 077; mkdir -p "$d" && chmod 700 "$d"{copy} )'
    )


# The detached session's script (worker/job_wrapper.sh), without its comments: it shows in `ps`.
JOB_WRAPPER = "\n".join(
    line
    for line in worker.source("job_wrapper.sh").decode().splitlines()
    if line and not line.startswith("#")
)


def start_detached(
    run_id: str,
    python: str,
    trainer_args: Sequence[str],
    env: Mapping[str, str],
    pid_wait_s: float = 10.0,
    *,
    home_env: Mapping[str, str] | None = None,
    home_prepend: Mapping[str, str] | None = None,
) -> str:
    """Start the job in a new session that outlives this SSH command and the console, then wait until it
    has recorded its process group and print `pgid=<n>`. The job learns its run folder as
    TPU_CONSOLE_RUN_DIR; `home_env` sets variables to folders under the worker's home (VIRTUAL_ENV), and
    `home_prepend` puts such a folder first in a path list (PATH, PYTHONPATH).

    `env` must hold no secret: it is part of the command line (`ps` shows it). Secrets go in `.env`.
    """
    home_env, home_prepend = dict(home_env or {}), dict(home_prepend or {})
    for name in (*env, *home_env, *home_prepend):
        if not _ENV_NAME.match(name):
            raise ValueError(f"invalid environment variable name {name!r}")
    d = _home_path(run_dir(run_id))
    exports = "".join(f"export {name}={shlex.quote(value)}; " for name, value in env.items())
    exports += "".join(f"export {name}={_home_path(folder)}; " for name, folder in home_env.items())
    for name, folder in home_prepend.items():
        exports += f'export {name}={_home_path(folder)}"${{{name}:+:${name}}}"; '
    tries = max(1, int(pid_wait_s / 0.05))
    job = " ".join([python_word(python), "-u", *(shlex.quote(a) for a in trainer_args)])
    return (
        f"( cd {d} || exit 3; "
        'if [ -e pid ] || [ -e exit ]; then echo "this run was already started here" >&2; exit 3; fi; '
        f'export TPU_CONSOLE_RUN_DIR="$PWD"; {exports}'
        # stdin/stdout/stderr away from the channel, so the SSH command ends at once.
        f"setsid bash -c {shlex.quote(JOB_WRAPPER)} tpu-console-run {job} </dev/null >/dev/null 2>&1 & "
        f"i=0; while [ ! -s pid ] && [ $i -lt {tries} ]; do sleep 0.05; i=$((i+1)); done; "
        'if [ -s pid ]; then echo "pgid=$(cat pid)"; '
        f'else echo "the job did not record its process group within {pid_wait_s:g}s" >&2; exit 4; fi )'
    )


def start_supervisor(run_id: str, python: str, wait_s: float = 15.0) -> str:
    """Start the run's supervisor (worker/supervisor.py, uploaded into the run folder) detached, wait until
    it listens, and print `port=<n>`."""
    d = _home_path(run_dir(run_id))
    tries = max(1, int(wait_s / 0.05))
    return (
        f"( cd {d} || exit 3; rm -f supervisor.port; "
        f"setsid {python_word(python)} -u supervisor.py . </dev/null >>supervisor.log 2>&1 & "
        f"i=0; while [ ! -s supervisor.port ] && [ $i -lt {tries} ]; do sleep 0.05; i=$((i+1)); done; "
        'if [ -s supervisor.port ]; then echo "port=$(cat supervisor.port)"; '
        'else echo "the run\'s supervisor did not start: $(tail -n 2 supervisor.log)" >&2; exit 4; fi )'
    )


def stop_supervisor(run_id: str) -> str:
    """End the run's supervisor (a launch that did not start on every worker takes it back)."""
    d = _home_path(run_dir(run_id))
    return (
        f"( cd {d} 2>/dev/null || exit 0; p=$(cat supervisor.pid 2>/dev/null); "
        'case "$p" in ""|*[!0-9]*) ;; *) kill -TERM "$p" 2>/dev/null;; esac; exit 0 )'
    )


def request_stacks(run_id: str, wait_s: float = 5.0) -> str:
    """SIGUSR1 to the run's job (the trainer dumps every thread's stack into `stacks.txt`, trainer/cli.py),
    then wait up to `wait_s` for the dump. Prints `state=answered`, `state=silent proc=<ps state>` (a job
    that did not answer: stopped, or blocked where Python cannot run), `state=ended` or `state=missing`,
    then, when answered, the dump base64-encoded on one line."""
    d = _home_path(run_dir(run_id))
    ticks = max(1, int(wait_s / 0.1))
    return (
        f"( cd {d} 2>/dev/null || {{ echo state=missing; exit 0; }}; "
        "p=$(cat job.pid 2>/dev/null || cat pid 2>/dev/null); "
        'case "$p" in ""|*[!0-9]*) echo state=ended; exit 0;; esac; '
        'if [ -e exit ] || ! kill -0 "$p" 2>/dev/null; then echo state=ended; exit 0; fi; '
        "s=$(wc -c <stacks.txt 2>/dev/null || echo 0); "
        'kill -USR1 "$p" 2>/dev/null; '
        f'i=0; while [ $i -lt {ticks} ]; do n=$(wc -c <stacks.txt 2>/dev/null || echo 0); '
        '[ "$n" -gt "$s" ] && break; sleep 0.1; i=$((i+1)); done; '
        'n=$(wc -c <stacks.txt 2>/dev/null || echo 0); '
        'if [ "$n" -le "$s" ]; then '
        "echo \"state=silent proc=$(awk '{print $3}' /proc/$p/stat 2>/dev/null)\"; exit 0; fi; "
        # the dump is written by a signal handler in one go; give it a moment to finish
        "sleep 0.3; echo state=answered; tail -c +$((s + 1)) stacks.txt | base64 | tr -d '\\n'; echo )"
    )


def read_run_file(run_id: str, name: str, max_bytes: int = 1 << 20) -> str:
    """The end of one file of the run folder (at most `max_bytes`), or nothing when it does not exist."""
    f = _home_path(f"{run_dir(run_id)}/{name}")
    return f"( tail -c {int(max_bytes)} {f} 2>/dev/null; exit 0 )"


def stop_run(run_id: str, grace_s: float = 10.0) -> str:
    """SIGTERM the job's process group, SIGKILL it if still alive after `grace_s`, wait briefly for the
    wrapper's `exit` file. Prints one `key=value ...` line: state=missing|exited|not-started|gone|stopped."""
    d = _home_path(run_dir(run_id))
    ticks = max(1, int(grace_s / 0.1))
    return (
        f"( cd {d} 2>/dev/null || {{ echo state=missing; exit 0; }}; "
        'if [ -e exit ]; then echo "state=exited exit=$(cat exit)"; exit 0; fi; '
        "pg=$(cat pid 2>/dev/null); "
        'case "$pg" in ""|*[!0-9]*) echo state=not-started; exit 0;; esac; '
        'if ! kill -TERM -- "-$pg" 2>/dev/null; then echo "state=gone exit=$(cat exit 2>/dev/null)"; exit '
        '0; fi; '
        f'i=0; while [ $i -lt {ticks} ] && kill -0 -- "-$pg" 2>/dev/null; do sleep 0.1; i=$((i+1)); done; '
        "signal=TERM; "
        'if kill -0 -- "-$pg" 2>/dev/null; then kill -KILL -- "-$pg" 2>/dev/null; signal=KILL; fi; '
        "i=0; while [ $i -lt 50 ] && [ ! -e exit ]; do sleep 0.1; i=$((i+1)); done; "
        'echo "state=stopped signal=$signal exit=$(cat exit 2>/dev/null)" )'
    )


# The run watch's follower and a run's single look (worker/run_follower.py).
FOLLOWER_SOURCE = worker.source("run_follower.py")


def probe_runs(run_ids: Sequence[str], events_tail_bytes: int = 0, log_tail_lines: int = 0,
               python: str = "python3", decisions_bytes: int = 0) -> PythonProgram:
    """One round trip telling, for each run: is its process group alive, its exit status and when it was
    written, the sizes of output.log and events.jsonl, and optionally the end of both files and of the
    supervisor's decisions (on its worker). The run follower's single look (worker/run_follower.py,
    `--once`, which says what it prints): the same producer as a followed run's state. Parsed by
    `tpu_console.observe.probe.parse_probe`."""
    tails = (events_tail_bytes, log_tail_lines, decisions_bytes)
    args = ("--once", f"~/{RUNS_DIR}", *(str(max(0, int(n))) for n in tails), *run_ids)
    return PythonProgram(FOLLOWER_SOURCE, args, python)


def tail_log(
    run_id: str,
    offset: int | None = None,
    lines: int | None = None,
    max_bytes: int = 1 << 20,
    file: str = "output.log",
) -> str:
    """Read the log from byte `offset` (at most `max_bytes`), or its last `lines` lines.

    Prints `end=<byte offset just after the data> size=<file size>` and then the data base64-encoded on
    one line, so the byte count is exact (the next read resumes at `end`) whatever the log holds.
    """
    if (offset is None) == (lines is None):
        raise ValueError("give exactly one of offset and lines")
    f = _home_path(f"{run_dir(run_id)}/{file}")
    head = f'( f={f}; size=$(wc -c 2>/dev/null <"$f"); size=${{size:-0}}; '
    if offset is not None:
        off = max(0, int(offset))
        return head + (
            f"off={off}; [ $off -gt $size ] && off=0; "
            f"n=$((size - off)); [ $n -gt {int(max_bytes)} ] && n={int(max_bytes)}; "
            'echo "end=$((off + n)) size=$size"; '
            'if [ $n -gt 0 ]; then tail -c +$((off + 1)) "$f" | head -c $n | base64 | tr -d "\\n"; fi; echo )'
        )
    return head + (
        'echo "end=$size size=$size"; '
        f'if [ $size -gt 0 ]; then head -c $size "$f" | tail -n {max(0, int(lines or 0))} '
        '| base64 | tr -d "\\n"; fi; echo )'
    )


# The run's supervision, uploaded into the run folder by `launch` (launch/start.py), as the files import
# one another there (by their bare names): on every worker, the job runner and what it imports (the run's
# record, a command job's step lines and their formats, a log line's own time, the VM's preemption notice);
# on the first worker, the supervisor and its parts (how the runners reach it, the webhook, the straggler
# rule, the record that outlives the node, the node's deletion, the Google APIs it calls).
RUNNER_MODULES = ("job_runner.py", "run_record.py", "step_lines.py", "step_formats.py", "log_timestamps.py",
                  "preemption_notice.py")
SUPERVISOR_MODULES = ("supervisor.py", "report_server.py", "webhook.py", "step_pace.py", "bucket_writer.py",
                      "node_deletion.py", "google_apis.py")
RUNNER_MODULE_SOURCES = {name: worker.source(name) for name in RUNNER_MODULES}
SUPERVISOR_MODULE_SOURCES = {name: worker.source(name) for name in SUPERVISOR_MODULES}


def follow_run(
    run_id: str,
    offsets: Mapping[str, int],
    poll_s: float,
    probe_s: float,
    max_bytes: int,
    python: str = "python3",
    last_lines: Mapping[str, int] | None = None,
) -> PythonProgram:
    """The program that streams the run's files from `offsets` and its job's state until the job has ended
    (worker/run_follower.py says what it prints). `last_lines`: files to start at their last N lines
    instead (the follower's first record for each says from where). `python`: for the exec path, looked
    up on the worker's PATH."""
    specs = [f"{name}={max(0, int(offset))}" for name, offset in offsets.items()]
    specs += [f"{name}~{max(0, int(lines))}" for name, lines in (last_lines or {}).items()]
    args = (f"~/{run_dir(run_id)}", f"{float(poll_s):g}", f"{float(probe_s):g}", str(int(max_bytes)), *specs)
    return PythonProgram(FOLLOWER_SOURCE, args, python)


LIBTPU_METRICS_ADDRESS = libtpu_probe.DEFAULT_ADDRESS


def libtpu_metrics(python: str, address: str = LIBTPU_METRICS_ADDRESS) -> str:
    """libtpu's runtime metrics of the worker's devices as one JSON line (worker/libtpu_probe.py)."""
    return f"{python_word(python)} -m tpu_console.worker.libtpu_probe --address {shlex.quote(address)}"
