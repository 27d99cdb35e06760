"""How runs look in a table and in JSON: the cells the CLI (and the TUI) show, built from a RunView."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tpu_console.launch.start import LaunchResult
from tpu_console.launch.stop import WorkerStop
from tpu_console.observe.lookup import RunView
from tpu_console.observe.monitor import WorkerState, WorkerStatus
from tpu_console.pricing import run_cost
from tpu_console.views.nodes import format_age

RUN_COLUMNS = ("RUN", "NODE", "WORKERS", "STATE", "AGE", "CONFIG", "COST", "NOTE")
WORKER_COLUMNS = ("WORKER", "STATE", "EXIT", "STEP", "STEP_S", "AVG10_S", "TOKENS/S", "MEM GiB", "NOTE")


def run_row(view: RunView, now: datetime) -> tuple[str, ...]:
    record = view.record
    return (
        record.run_id,
        record.node,
        _workers_text(record.workers),
        view.state,
        format_age(record.started_at, now),
        job_label(record),
        _cost(record, now),
        view.failure or view.problem or "",
    )


def worker_row(status: WorkerStatus, slice_index: int | None = None) -> tuple[str, ...]:
    """`slice_index`: the worker's slice on a multislice run, shown beside its number (`[5] slice 1`)."""
    step = status.events.last_step
    return (
        f"[{status.worker}]" if slice_index is None else f"[{status.worker}] slice {slice_index}",
        "stopped" if status.stopped else str(status.state),
        "-" if status.exit_status is None else str(status.exit_status),
        "-" if step is None else str(step.step),
        _num(step.step_s if step else None, ".2f"),
        _num(step.step_avg_last10_s if step else None, ".2f"),
        _num(step.tokens_per_s if step else None, ",.0f"),
        _memory(status),
        _worker_note(status),
    )


# Past this many workers, `status` counts the workers by state and lists only the odd ones out: a
# 256-host run's table would otherwise be 256 rows to scroll through for the one that failed.
SUMMARY_AFTER = 16
MAX_LISTED = 16


def worker_state_label(status: WorkerStatus) -> str:
    if status.stopped:
        return "stopped"
    if status.state is WorkerState.EXITED and status.exit_status != 0:
        return "failed"
    if status.unreachable_probes and not status.done:
        return "unreachable"
    return str(status.state)


def worker_summary(statuses: list[WorkerStatus]) -> tuple[list[str], list[WorkerStatus]]:
    """For a large run: one line per state (`running  250  workers 0-16,18-255`), and the workers worth a
    row of their own, the worst first: failed or lost, unreachable, with an error, then those in a state
    few others share (MAX_LISTED at most; the others are in the counts)."""
    labels = {s.worker: worker_state_label(s) for s in statuses}
    by_label: dict[str, list[int]] = {}
    for worker, label in labels.items():
        by_label.setdefault(label, []).append(worker)
    usual = max(by_label, key=lambda label: len(by_label[label])) if by_label else ""

    def rank(status: WorkerStatus) -> int | None:
        label = labels[status.worker]
        if status.failed:
            return 0
        if label == "unreachable":
            return 1
        if status.events.error_message:
            return 2
        return 3 if label != usual else None

    ranked = sorted((r, s.worker, s) for s in statuses if (r := rank(s)) is not None)
    listed = [s for _, _, s in ranked[:MAX_LISTED]]
    width = max(len(label) for label in by_label) if by_label else 0
    lines = [f"{label:<{width}}  {len(workers):>5}  workers {worker_ranges(workers)}"
             for label, workers in sorted(by_label.items(), key=lambda item: (-len(item[1]), item[0]))]
    return lines, sorted(listed, key=lambda s: s.worker)


def worker_ranges(workers: list[int]) -> str:
    """`0-15,17,19-255`: consecutive workers as ranges."""
    spans: list[list[int]] = []
    for worker in sorted(workers):
        if spans and worker == spans[-1][1] + 1:
            spans[-1][1] = worker
        else:
            spans.append([worker, worker])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _cost(record: Any, now: datetime | None = None) -> str:
    cost = run_cost(record.price_per_hour, record.started_at, record.finished_at, now)
    return "-" if cost is None else f"~${cost:,.2f}"


def _worker_note(status: WorkerStatus) -> str:
    if status.events.error_message:
        return status.events.error_message
    if status.reason:
        return status.reason
    if status.failed and status.log_tail:
        return status.log_tail[-1]
    if status.events.end is not None:
        return "ended: " + str(status.events.end.get("status", "ok"))
    return ""


def _memory(status: WorkerStatus) -> str:
    """`in use / peak / limit` GiB of the worker's most loaded device; `-` where the platform has none."""
    step = status.events.last_step
    if step is None or (step.mem_in_use_gib is None and step.mem_peak_gib is None):
        return "-"
    parts = [_num(step.mem_in_use_gib, ".1f"), _num(step.mem_peak_gib, ".1f")]
    if step.mem_limit_gib is not None:
        parts.append(_num(step.mem_limit_gib, ".1f"))
    return "/".join(parts)


def run_record(view: RunView) -> dict[str, Any]:
    record = view.record
    return {
        "run_id": record.run_id,
        "node": record.node,
        "provider": record.provider,
        "accelerator_type": record.accelerator_type,
        "workers": record.workers,
        "state": view.state,
        "failure": view.failure,
        "live": view.live,
        "problem": view.problem,
        "started_at": record.started_at.isoformat(),
        "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        "stop_requested_at": record.stop_requested_at.isoformat() if record.stop_requested_at else None,
        "config_path": record.config_path,
        "config_digest": record.config_digest,
        "overrides": record.overrides,
        "code_version": record.code,  # a command job's project digest; the trainer's console commit
        "python": record.python,
        "price_per_hour": record.price_per_hour,
        "cost": run_cost(record.price_per_hour, record.started_at, record.finished_at),
        "worker_status": [worker_record(s) for s in view.workers],
    }


def worker_record(status: WorkerStatus) -> dict[str, Any]:
    step = status.events.last_step
    start = status.events.start
    return {
        "worker": status.worker,
        "state": "stopped" if status.stopped else str(status.state),
        "exit_status": status.exit_status,
        "pgid": status.pgid,
        "reason": status.reason,
        "error": status.events.error_message,
        "log_bytes": status.log_bytes,
        "events_bytes": status.events_bytes,
        "config_digest": start.get("config_digest") if start else None,
        "last_step": None
        if step is None
        else {
            "step": step.step,
            "step_s": step.step_s,
            "step_avg_last10_s": step.step_avg_last10_s,
            "valid_tokens_per_s": step.tokens_per_s,
            "bytes_in_use_max_gib": step.mem_in_use_gib,
            "peak_bytes_in_use_max_gib": step.mem_peak_gib,
            "bytes_limit_gib": step.mem_limit_gib,
            "loss": step.loss,
            "reward_mean": step.reward_mean,
            "phases_s": step.phases,
        },
        "ended": status.events.end is not None,
        "log_tail": status.log_tail,
    }


def launch_record(result: LaunchResult) -> dict[str, Any]:
    return {
        "run_id": result.run_id,
        "node": result.node.name,
        "provider": result.node.provider,
        "workers": result.workers,
        "run_dir": f"~/{result.run_dir}",
        "config_digest": result.config_digest,
        "job": result.job,  # launch.json's `job` object: what ran, where, from which project and setup
        "started": result.ok,
        "starts": [{"worker": s.worker, "ok": s.ok, "pgid": s.pgid, "error": s.error} for s in result.starts],
    }


def stop_record(stop: WorkerStop) -> dict[str, Any]:
    return {
        "worker": stop.worker,
        "outcome": stop.outcome,
        "signal": stop.signal,
        "exit_status": stop.exit_status,
        "error": stop.error,
    }


def _workers_text(workers: list[int]) -> str:
    if workers and workers == list(range(workers[0], workers[-1] + 1)) and len(workers) > 1:
        return f"{workers[0]}-{workers[-1]}"
    return ",".join(str(w) for w in workers)


def job_label(record: Any, width: int = 32) -> str:
    """What a run ran, in a table cell: the trainer config's or the job file's name, else the command
    (its program's name and arguments, cut to `width`)."""
    job = record.job or {}
    if job.get("kind") != "command" or job.get("job_file"):
        return _short_path(record.config_path)
    program, *args = job.get("command") or [record.config_path]
    text = " ".join([_short_path(str(program)), *map(str, args)])
    return text if len(text) <= width else text[: width - 3] + "..."


def _short_path(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
