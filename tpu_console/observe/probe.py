"""Reading what one worker says about each of its runs: the run follower's single look (worker/run_follower.py
`--once`, sent by fleet/run_recipes.py's `probe_runs`), and its state lines while it follows a run."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from tpu_console.fleet.run_recipes import MARK
from tpu_console.history.events import Event, parse_events


@dataclass(frozen=True)
class RunProbe:
    run_id: str
    missing: bool = False  # the worker has no folder for this run
    pgid: int | None = None  # None until the wrapper has recorded it
    alive: bool = False  # the job's process group still has a process
    exit_status: int | None = None  # from the `exit` file; None while running
    exit_time: float | None = None  # when `exit` was written (unix s)
    log_bytes: int = 0
    events_bytes: int = 0
    events: list[Event] = field(default_factory=list)  # complete events from the end of events.jsonl
    log_tail: list[str] = field(default_factory=list)  # last lines of output.log
    decisions: str | None = None  # the end of supervisor.jsonl, when asked and the supervisor is here


def parse_probe(stdout: str, events_tail_bytes: int = 0) -> dict[str, RunProbe]:
    """Probes by run id. Sections that cannot be read are left out (the caller treats them as unknown)."""
    probes: dict[str, RunProbe] = {}
    for block in stdout.split(f"{MARK}run ")[1:]:
        head, *sections = block.split(f"\n{MARK}")
        run_id, _, status = head.partition("\n")
        run_id = run_id.strip()
        probe = probe_from_status(run_id, status)
        if probe.missing:
            probes[run_id] = probe
            continue
        events: list[Event] = []
        log_tail: list[str] = []
        decisions = None
        for section in sections:
            name, _, body = section.partition("\n")
            if name == "events":
                events = parse_events(body, starts_mid_line=0 < events_tail_bytes < probe.events_bytes)
            elif name == "log":
                log_tail = [line for line in body.rstrip("\n").split("\n") if line] if body.strip() else []
            elif name == "decisions":
                decisions = body
        probes[run_id] = replace(probe, events=events, log_tail=log_tail, decisions=decisions)
    return probes


def probe_from_status(run_id: str, status: str) -> RunProbe:
    """A probe from its status line alone (`missing=1`, or `pid=.. alive=.. exit=.. ...`), as the run
    follower's `probe` (worker/run_follower.py) prints it, in a single look and while following."""
    values = _key_values(status)
    if values.get("missing") == "1":
        return RunProbe(run_id, missing=True)
    return RunProbe(
        run_id,
        pgid=_int(values.get("pid")),
        alive=values.get("alive") == "1",
        exit_status=_int(values.get("exit")),
        exit_time=_float(values.get("exit_t")),
        log_bytes=_int(values.get("log")) or 0,
        events_bytes=_int(values.get("events")) or 0,
    )


def _key_values(text: str) -> dict[str, str]:
    line = next((line for line in text.split("\n") if "=" in line), "")
    pairs = (word.partition("=") for word in line.split())
    return {key: value for key, _, value in pairs}


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text and text.strip() else None
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        return float(text.strip()) if text and text.strip() else None
    except ValueError:
        return None
