"""Log signatures: the lines in a worker's `output.log` that say what went wrong on a TPU, and the W&B
run URL.

Pure: no I/O. `SignatureScanner.scan(line)` is called for every line of one worker's log, in order, and
returns a `Finding` when the line matches a known signature (or completes a Python traceback). The
patterns are the messages JAX, libtpu, the XLA coordination service, wandb and the trainer print, as
recorded in `tests/console/observe/test_signatures.py`.

Speed matters (the console scans every line of 1,024 workers): one combined regular expression with a
cheap substring pre-filter decides in about a microsecond that an ordinary line matches nothing, and
`scan_lines` looks for the pre-filter's words once in a whole chunk of lines, so a chunk in which none
appears (and no traceback is open) costs a few substring searches, not a call per line.
"""

from __future__ import annotations

import bisect
import itertools
import re
from dataclasses import dataclass, replace

from trainer.cli import OOM_HINT  # the trainer's own advice for an OOM; stdlib + pydantic only, no JAX

# Kinds of finding, most specific first. `problem` kinds make a worker's failure explanation;
# `wandb_url` is information.
OOM = "oom"
WRONG_PROCESS_COUNT = "wrong_process_count"
TPU_IN_USE = "tpu_in_use"
DISTRIBUTED_TIMEOUT = "distributed_timeout"
LOST_WORKER = "lost_worker"
PREEMPTED = "preempted"
WANDB_AUTH = "wandb_auth"
WANDB_INIT = "wandb_init"
EXCEPTION = "exception"
WANDB_URL = "wandb_url"

HINTS = {
    OOM: OOM_HINT,
    WRONG_PROCESS_COUNT: "the job must run on every worker of the slice: launch with --worker all",
    TPU_IN_USE: "another process holds the TPU (a previous run?): launch with --kill-stale, or stop that run",
    DISTRIBUTED_TIMEOUT: "a worker never joined jax.distributed: check that every worker was launched and "
    "is reachable from worker 0 (the coordinator)",
    LOST_WORKER: "another worker of the job went away (its process died or its host was lost): look at the "
    "first worker that failed",
    PREEMPTED: "the TPU was preempted or taken for maintenance: recreate the node (launch --recover) or "
    "restart the run (launch --restart-on transient)",
    WANDB_AUTH: "W&B refused the API key: put a valid WANDB_API_KEY in the .env given to --env-file, "
    "or set wandb_mode: disabled",
    WANDB_INIT: "wandb.init failed: check the network from the workers, or set wandb_mode: offline",
}


@dataclass(frozen=True)
class Finding:
    kind: str
    line: str  # the line that matched (the exception line, for a traceback)
    detail: str | None = None  # e.g. the URL, or "Used 17.4G of 15.5G hbm"
    local_batch: int | None = None  # for OOM, from the trainer's `(local_batch=N)` line when present
    # for a traceback: the whole of it, `Traceback (most recent call last):` to the exception line (with
    # the tracebacks it was chained to), for where a person reads the error whole
    traceback: str | None = None

    @property
    def hint(self) -> str | None:
        return HINTS.get(self.kind)

    @property
    def message(self) -> str:
        """One line for a person: what happened, and the fix."""
        text = self.detail or self.line.strip()
        if self.kind == OOM and self.local_batch is not None:
            text += f" (local_batch={self.local_batch})"
        return f"{text}; {self.hint}" if self.hint else text


# (kind, pattern) in priority order; the first that matches a line wins.
_PATTERNS: list[tuple[str, str]] = [
    (
        OOM,
        (
            r"RESOURCE_EXHAUSTED|[Oo]ut of memory (?:in memory space hbm|while trying to allocate)"
            r"|Ran out of memory in memory space hbm|error: out of device memory"
        ),
    ),
    (WRONG_PROCESS_COUNT, r"only some workers were launched|Expected \d+ JAX processes but"),
    (
        TPU_IN_USE,
        (
            r"TPU is already in use|libtpu_lockfile|TPU platform already in use"
            r"|Unable to initialize backend 'tpu'.*(?:in use|busy)"
        ),
    ),
    (
        LOST_WORKER,
        (
            r"stopped sending heartbeats|tasks are unhealthy|[Tt]ask \S+ (?:has been|was) lost"
            r"|[Pp]eer (?:task|process) .*(?:disconnected|lost)"
        ),
    ),
    (PREEMPTED, r"TPU (?:VM )?(?:was|has been) preempted|[Pp]reemption notice|maintenance event"),
    (
        DISTRIBUTED_TIMEOUT,
        (
            r"DEADLINE_EXCEEDED|Barrier timed out|coordination service.*(?:timed? ?out|unavailable)"
            r"|Failed to connect to coordination service|jax\.distributed\.initialize\(\) failed"
        ),
    ),
    (WANDB_AUTH, r"wandb.*(?:\b401\b|api_key not configured|user is not logged in|invalid API key)"),
    (
        WANDB_INIT,
        (
            r"wandb.*(?:Run initialization has timed out|Error communicating with wandb process"
            r"|wandb\.init\(\) failed|CommError|UsageError)"
        ),
    ),
    (WANDB_URL, r"https://wandb\.ai/\S+/runs/[\w-]+"),
]
_COMBINED = re.compile("|".join(f"(?P<{kind}>{pattern})" for kind, pattern in _PATTERNS))
# A line can only match if it holds one of these (checked with `in`, much faster than any regex).
_PREFILTER = (
    "RESOURCE",
    "emory",
    "JAX processes",
    "only some",
    "TPU",
    "libtpu",
    "DEADLINE",
    "Barrier",
    "heartbeat",
    "unhealthy",
    "lost",
    "reempt",
    "maintenance",
    "oordination",
    "distributed",
    "wandb",
    "Traceback",
)


def patterns() -> list[tuple[str, str]]:
    """(kind, regular expression) of every problem signature, in priority order: what the job runners on
    the pod classify a failure with (observe/supervision.py ships them). Python 3.8's `re` reads them."""
    return [(kind, pattern) for kind, pattern in _PATTERNS if kind != WANDB_URL]


_HBM_USAGE = re.compile(r"Used [\d.]+[KMGT]? of [\d.]+[KMGT]? hbm|Attempting to allocate [\d.]+[KMGT]?")
_LOCAL_BATCH = re.compile(r"local_batch=(\d+)")
# The line that ends a traceback: `ValueError: ...`, `jaxlib.xla_extension.XlaRuntimeError: ...`,
# `KeyboardInterrupt`.
_EXCEPTION_LINE = re.compile(
    r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning|Terminated)\b(?::.*)?$"
)
_TRACEBACK_START = "Traceback (most recent call last):"
# Between two chained tracebacks (`raise ... from`, an exception while handling another).
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
MAX_TRACEBACK_LINES = 400  # a deeper one keeps its last lines: the frames nearest the error


class SignatureScanner:
    """Scans one worker's log, line by line; remembers what it found (first problem, last exception, URL)."""

    def __init__(self, local_batch: int | None = None) -> None:
        """`local_batch`: the run's prompts x samples per process, when the config is known (launch.json)."""
        self.findings: list[Finding] = []  # problems, in order (bounded: the first 20 are kept)
        self.wandb_url: str | None = None
        self.last_exception: Finding | None = None
        self._in_traceback = False
        self._traceback_lines: list[str] = []  # the traceback being read
        self._left_out = 0  # of its lines, those dropped to stay bounded
        self._chained: list[str] = []  # the traceback just ended, while a chained one may follow
        self._local_batch = local_batch

    @property
    def first_problem(self) -> Finding | None:
        """The most telling problem: a specific signature beats a bare traceback line."""
        specific = [f for f in self.findings if f.kind != EXCEPTION]
        first = specific[0] if specific else self.last_exception
        if first is not None and first.kind == OOM and first.local_batch is None and self._local_batch:
            # The trainer prints `(local_batch=N)` a line after the XLA error itself.
            first = replace(first, local_batch=self._local_batch)
        return first

    def scan_lines(self, lines: list[str]) -> list[Finding]:
        """`scan` of each line in order, the findings. A line that holds none of the pre-filter's words
        can only matter inside a traceback (or right after one): outside, it is passed over unscanned."""
        findings = []
        done = 0  # lines before this one are scanned or passed over
        for index in [*_candidates(lines), len(lines)]:
            while done < index and (self._in_traceback or self._chained):
                if (finding := self.scan(lines[done])) is not None:
                    findings.append(finding)
                done += 1
            if index < len(lines):
                if (finding := self.scan(lines[index])) is not None:
                    findings.append(finding)
                done = index + 1
        return findings

    def scan(self, line: str) -> Finding | None:
        finding = self._traceback(line)
        if not any(word in line for word in _PREFILTER):
            return self._keep(finding)
        match = _COMBINED.search(line)
        if match is None:
            return self._keep(finding)
        kind = match.lastgroup or ""
        if kind == WANDB_URL:
            self.wandb_url = self.wandb_url or match.group(0)
            return Finding(WANDB_URL, line, detail=match.group(0))
        if kind == OOM:
            if batch := _LOCAL_BATCH.search(line):
                self._local_batch = int(batch.group(1))
            usage = _HBM_USAGE.search(line)
            return self._keep(
                Finding(OOM, line, detail=_oom_detail(line, usage), local_batch=self._local_batch)
            )
        return self._keep(Finding(kind, line))

    def _traceback(self, line: str) -> Finding | None:
        """A traceback is `Traceback ...`, indented frames, then the unindented exception line; one chained
        to it (after `The above exception ...`) is kept with it."""
        if line.startswith(_TRACEBACK_START):
            chained = any(earlier.startswith(_CHAINED) for earlier in self._chained)
            self._in_traceback = True
            self._traceback_lines = [*self._chained, line] if chained else [line]
            self._left_out, self._chained = 0, []
            return None
        if not self._in_traceback:
            if self._chained and (not line.strip() or line.startswith(_CHAINED)):
                self._chained.append(line)
            else:
                self._chained = []
            return None
        if not line or line[0] in " \t":
            self._traceback_lines.append(line)
            if len(self._traceback_lines) > 2 * MAX_TRACEBACK_LINES:  # bounded, however deep
                self._left_out += MAX_TRACEBACK_LINES
                del self._traceback_lines[:MAX_TRACEBACK_LINES]
            return None
        self._in_traceback = False
        if not _EXCEPTION_LINE.match(line.strip()):
            return None
        lines = [*self._traceback_lines, line.rstrip()]
        self._chained = lines[-MAX_TRACEBACK_LINES:]
        left_out = self._left_out + max(0, len(lines) - MAX_TRACEBACK_LINES)
        if left_out:
            lines = [f"({left_out} earlier lines of the traceback left out)", *lines[-MAX_TRACEBACK_LINES:]]
        self.last_exception = Finding(EXCEPTION, line.strip(), traceback="\n".join(lines))
        return self.last_exception

    def _keep(self, finding: Finding | None) -> Finding | None:
        if finding is not None and finding.kind != WANDB_URL and len(self.findings) < 20:
            self.findings.append(finding)
        return finding


def _candidates(lines: list[str]) -> list[int]:
    """The indices of the lines that hold a word of the pre-filter, in order: each word looked for once
    in the lines joined (no word holds a newline, so none is found across two lines)."""
    text = "\n".join(lines)
    hits = []
    for word in _PREFILTER:
        at = text.find(word)
        while at >= 0:
            hits.append(at)
            at = text.find(word, at + len(word))
    if not hits:
        return []
    starts = list(itertools.accumulate((len(line) + 1 for line in lines[:-1]), initial=0))
    return sorted({bisect.bisect_right(starts, at) - 1 for at in hits})


def _oom_detail(line: str, usage: re.Match[str] | None) -> str:
    if usage is not None:
        return f"out of HBM: {usage.group(0)}"
    return "out of device memory (RESOURCE_EXHAUSTED)"
