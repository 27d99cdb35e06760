"""The worker side of a run watch: one long-lived process per worker that streams a run's files and its
job's state to the console, so a line reaches the console a few tens of milliseconds after it is written,
with no command per poll (tpu_console/observe/watch.py is the console side). It is also the one producer
of a run's state on a worker: a single look (`--once`, below) answers `status`, `runs` and the rest
(observe/probe.py reads it), so the state line has one definition, `probe` here.

A PythonProgram (fleet/program.py), with arguments RUN_DIR POLL_S PROBE_S MAX_BYTES FILE=OFFSET|FILE~LINES...:
the command channel's agent runs it in a fork of itself, the exec path with `python3 -I -S`. Python 3.8+
and the standard library only; RUN_DIR may start with `~/` (no shell expands it). `FILE~LINES` starts at
the file's last LINES lines (as `tail -n`; from 0 when the file does not exist yet), and says where with a
first `C` record, empty when there is nothing to send: the console learns the offset without another
command (logs -f and the dashboard open each log at its last lines).

It writes one line per record on stdout, flushed as it goes:

    C <file> <start> <end> <size> <base64>   bytes start..end of <file>, whose size was <size> (a chunk of
                                             at most MAX_BYTES; chunks of a file follow on from each other)
    P <status>                               the job's state (`probe`): `missing=1`, or
                                             `pid=.. alive=0|1 exit=.. exit_t=.. log=.. events=..`;
                                             at the start, every PROBE_S (a heartbeat), and at the end
    E                                        the job has ended and every file was read to its end: the last

A single look, `--once RUNS_DIR EVENTS_TAIL_BYTES LOG_TAIL_LINES DECISIONS_BYTES RUN_ID...`
(fleet/run_recipes.py, `probe_runs`), prints for each run, then exits:

    <RS>run <id>                             RS: the record separator, \x1e (no JSON line holds it raw)
    <status>                                 as in `P` above
    <RS>events                               when EVENTS_TAIL_BYTES: the last bytes of events.jsonl
    <RS>log                                  when LOG_TAIL_LINES: the last lines of output.log
    <RS>decisions                            when DECISIONS_BYTES and the run's supervisor is here: the
                                             last bytes of supervisor.jsonl

A file that does not exist yet is waited for; one that shrank (rewritten) is read again from 0. When its
stdout is not read (the console fell behind), the follower waits in its write: it never buffers.
"""

import binascii  # not base64: that imports re, enum and more, a third of the follower's start-up
import os
import sys
import time

# The wrapper writes `exit` just after the job's process group ends: look again before calling it lost.
EXIT_FILE_GRACE_S = 0.5


def _read_text(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _size(path):
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def probe(run_dir):
    """The job's state as (status line, over). `over`: nothing more will happen (exited, gone, missing)."""
    if not os.path.isdir(run_dir):
        return "missing=1", True
    pid_text = _read_text(os.path.join(run_dir, "pid"))
    pgid = int(pid_text) if pid_text.isdigit() else None
    alive = False
    if pgid is not None:
        try:
            os.killpg(pgid, 0)
            alive = True
        except PermissionError:
            alive = True  # it exists, owned by someone else
        except OSError:
            pass
    exit_path = os.path.join(run_dir, "exit")
    exit_text = _read_text(exit_path)
    if not alive and not exit_text and pgid is not None:
        time.sleep(EXIT_FILE_GRACE_S)
        exit_text = _read_text(exit_path)
    exit_time = ""
    if exit_text:
        try:
            exit_time = f"{os.stat(exit_path).st_mtime_ns / 1e9:.9f}"
        except OSError:
            pass
    log, events = _size(os.path.join(run_dir, "output.log")), _size(os.path.join(run_dir, "events.jsonl"))
    status = (
        f"pid={pid_text} alive={int(alive)} exit={exit_text} exit_t={exit_time} log={log} events={events}"
    )
    over = bool(exit_text) or (pgid is not None and not alive)
    return status, over


def start_of_last_lines(file, size, lines):
    """The offset where the last `lines` lines of `file` (`size` bytes) begin; a last line without its
    newline counts as a line, as for `tail -n`."""
    if lines <= 0:
        return size
    end = size
    if size:
        file.seek(size - 1)
        if file.read(1) == b"\n":
            end = size - 1  # the last line's own newline starts no line
    found, pos = 0, end
    while pos > 0:
        step = min(1 << 16, pos)
        pos -= step
        file.seek(pos)
        block = file.read(step)
        at = len(block)
        while True:
            at = block.rfind(b"\n", 0, at)
            if at < 0:
                break
            found += 1
            if found == lines:
                return pos + at + 1
    return 0


class FileTail:
    """One file, read from an offset on (or from its last `last_lines` lines): its new bytes, as they come."""

    def __init__(self, path, name, offset, last_lines=None):
        self.path = path
        self.name = name
        self.offset = offset
        self.last_lines = last_lines
        self.file = None

    def read(self, max_bytes):
        """A `C` record of the next bytes, or None when there are none yet."""
        if self.file is None:
            try:
                self.file = open(self.path, "rb")  # noqa: SIM115 - kept open while it is followed
            except OSError:
                self.last_lines = None  # it does not exist yet: every line it will hold is new
                return None
        size = os.fstat(self.file.fileno()).st_size
        if self.last_lines is not None:
            self.offset = start_of_last_lines(self.file, size, self.last_lines)
            self.last_lines = None
            if self.offset == size:  # nothing to send: say where the next bytes will start
                return b"C %s %d %d %d " % (self.name.encode(), size, size, size)
        if size < self.offset:
            self.offset = 0  # the file was rewritten: start over, as the console will
        if size == self.offset:
            return None
        self.file.seek(self.offset)
        data = self.file.read(min(max_bytes, size - self.offset))
        if not data:
            return None
        start, self.offset = self.offset, self.offset + len(data)
        encoded = binascii.b2a_base64(data, newline=False)
        return b"C %s %d %d %d %s" % (self.name.encode(), start, self.offset, size, encoded)


def follow(run_dir, poll_s, probe_s, max_bytes, offsets, out):
    """`offsets`: (file name, byte offset, or None and a count of last lines) for each file."""
    tails = [
        FileTail(os.path.join(run_dir, name), name, offset or 0, lines) for name, offset, lines in offsets
    ]
    next_probe = 0.0
    while True:
        records = [r for r in (t.read(max_bytes) for t in tails) if r is not None]
        now = time.monotonic()
        if now >= next_probe:
            status, over = probe(run_dir)
            if over:
                # Read everything the job wrote before it ended, then say so.
                while records:
                    _write(out, records)
                    records = [r for r in (t.read(max_bytes) for t in tails) if r is not None]
                _write(out, [b"P " + status.encode(), b"E"])
                return
            records.append(b"P " + status.encode())
            next_probe = now + probe_s
        if records:
            _write(out, records)
        else:
            time.sleep(poll_s)


def _write(out, records):
    out.write(b"\n".join(records) + b"\n")
    out.flush()


MARK = b"\x1e"  # fleet/run_recipes.py's MARK: separates a single look's sections
DECISIONS_FILE = "supervisor.jsonl"  # the run's supervisor's decisions (supervisor.py)


def look_once(runs_dir, run_ids, events_tail_bytes, log_tail_lines, out, decisions_bytes=0):
    """Each run's state, and the ends of its events, log and decisions when asked: the `--once` output
    above."""
    for run_id in run_ids:
        run_dir = os.path.join(runs_dir, run_id)
        status, _ = probe(run_dir)
        parts = [b"\n" + MARK + b"run " + run_id.encode() + b"\n" + status.encode() + b"\n"]
        if status != "missing=1":
            if events_tail_bytes > 0:
                parts.append(MARK + b"events\n" + _last_bytes(os.path.join(run_dir, "events.jsonl"),
                                                              events_tail_bytes))
            if log_tail_lines > 0:
                parts.append(b"\n" + MARK + b"log\n" + _last_lines(os.path.join(run_dir, "output.log"),
                                                                    log_tail_lines))
            decisions = os.path.join(run_dir, DECISIONS_FILE)
            if decisions_bytes > 0 and os.path.exists(decisions):
                parts.append(b"\n" + MARK + b"decisions\n" + _last_bytes(decisions, decisions_bytes))
        out.write(b"".join(parts))
    out.flush()


def _last_bytes(path, count):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - count))
            return f.read(count)
    except OSError:
        return b""


def _last_lines(path, lines):
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(start_of_last_lines(f, size, lines))
            return f.read(size)
    except OSError:
        return b""


def main(argv):
    if argv and argv[0] == "--once":
        runs_dir, tails = os.path.expanduser(argv[1]), [int(n) for n in argv[2:5]]
        look_once(runs_dir, argv[5:], tails[0], tails[1], sys.stdout.buffer, decisions_bytes=tails[2])
        return
    run_dir, poll_s, probe_s, max_bytes = (
        os.path.expanduser(argv[0]),
        float(argv[1]),
        float(argv[2]),
        int(argv[3]),
    )
    offsets = []
    for spec in argv[4:]:
        name, _, offset = spec.rpartition("=")
        if name:
            offsets.append((name, int(offset), None))
        else:
            name, _, lines = spec.rpartition("~")
            offsets.append((name, None, int(lines)))
    try:
        follow(run_dir, poll_s, probe_s, max_bytes, offsets, sys.stdout.buffer)
    except (BrokenPipeError, KeyboardInterrupt):
        pass  # the console went away


if __name__ == "__main__":  # run by the loader (its exec runs this in __main__), or as a script
    main(sys.argv[1:])
