"""What the CLI prints: JSON documents, progress lines on stderr, errors, and the tables of the verbs that
have one (the node and run tables the app shows too live in views/nodes.py and views/runs.py)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from tpu_console.secrets import SecretMasker
from tpu_console.views.nodes import format_age, format_table


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2))


def print_masked_json(masker: SecretMasker, document: dict[str, Any]) -> None:
    print(masker.mask(json.dumps(document, indent=2)))


def print_error(message: str, json_mode: bool) -> None:
    print(f"error: {message}", file=sys.stderr)
    if json_mode:
        print_json({"error": message})


def progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def worker_progress(worker: int, text: str) -> None:
    print(f"[{worker}] {text}", file=sys.stderr, flush=True)


# ---- tables ------------------------------------------------------------------------------------------------


def capacity_table(records: list[Any]) -> str:
    """`tpu-console capacity`: one row per zone and type (providers.capacity.ZoneRecord)."""
    rows = []
    for r in records:
        wait = format_seconds(r.median_wait_s) if r.median_wait_s is not None else "-"
        rate = r.preemptions_per_node_hour
        preemptions = "-" if rate is None else f"{rate:.2f} ({r.preemptions} in {r.spot_node_hours:.1f} h)"
        rows.append((r.zone, r.accelerator_type, str(r.attempts), str(r.successes), wait, preemptions))
    return format_table(("ZONE", "TYPE", "ATTEMPTS", "READY", "MEDIAN WAIT", "PREEMPTIONS/NODE-H"), rows)


def capacity_record(record: Any) -> dict[str, Any]:
    rate = record.preemptions_per_node_hour
    return {"zone": record.zone, "accelerator_type": record.accelerator_type, "attempts": record.attempts,
            "successes": record.successes, "median_wait_s": record.median_wait_s,
            "preemptions": record.preemptions, "spot_node_hours": round(record.spot_node_hours, 4),
            "preemptions_per_node_hour": round(rate, 4) if rate is not None else None}


def format_seconds(seconds: float) -> str:
    """`42s`, `12m05s`, `3h10m`."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def print_exec_summary(outcome: Any, out: TextIO) -> None:
    rows = []
    for r in outcome.results:
        if r.error is not None or r.exit_status is None:
            rows.append((f"[{r.worker}]", "-", f"{r.duration_s:.2f}s", r.error or "did not finish"))
        else:
            rows.append(
                (f"[{r.worker}]", str(r.exit_status), f"{r.duration_s:.2f}s", "ok" if r.ok else "failed")
            )
    print(format_table(("WORKER", "EXIT", "TIME", ""), rows), file=out)


def print_setup(result: Any, json_mode: bool) -> int:
    """The per-worker table of bootstrap and sync; exit status 1 when a worker failed."""
    if json_mode:
        print_json({"node": result.node.name, "ok": result.ok, "workers": [
            {"worker": w.worker, "ok": w.ok, "error": w.error, "seconds": round(w.seconds, 2),
             "ready": w.report.ready, "versions": w.versions, "code": w.report.code}
            for w in result.workers]})
    else:
        rows = [(f"[{w.worker}]", "ok" if w.ok else "FAILED", w.code,
                 w.report.versions_label() if w.ok else (w.error or ""), f"{w.seconds:.1f}s")
                for w in result.workers]
        print(format_table(("WORKER", "", "CODE", "VERSIONS", "TIME"), rows))
    return 0 if result.ok else 1


def print_demo(result: Any, json_mode: bool) -> int:
    """What `demo` made (or found) on each worker; exit status 1 when a worker failed."""
    if json_mode:
        print_json({"node": result.node.name, "ok": result.ok, "model_path": result.model_path,
                    "data_path": result.data_path, "workers": [
                        {"worker": w.worker, "ok": w.ok, "error": w.error, "done": w.report.steps,
                         "seconds": round(w.seconds, 2)} for w in result.workers]})
    else:
        rows = [(f"[{w.worker}]", "ok" if w.ok else "FAILED",
                 "; ".join(w.report.steps) if w.ok else (w.error or ""), f"{w.seconds:.1f}s")
                for w in result.workers]
        print(format_table(("WORKER", "", "DONE", "TIME"), rows))
    return 0 if result.ok else 1


def launch_table(result: Any) -> str:
    rows = [(f"[{s.worker}]", "started" if s.ok else "failed", str(s.pgid or "-"), s.error or "")
            for s in result.starts]
    return format_table(("WORKER", "START", "PGID", ""), rows)


def recovery_table(managed: Any) -> str | None:
    """A managed run's recoveries: why, the runs before and after, the steps lost, the seconds from the
    loss to the first new step (controller/state.py)."""
    runs = {i.n: i.run_id for i in managed.incarnations}
    rows = [(datetime.fromtimestamp(r.detected_at, UTC).strftime("%H:%M:%S"), r.reason,
             runs.get(r.n - 1) or "-", runs.get(r.n) or "-", r.zone or "-",
             str(r.last_step_before if r.last_step_before is not None else "-"),
             str(r.resumed_step if r.resumed_step is not None else "-"),
             str(r.steps_lost if r.steps_lost is not None else "-"),
             f"{r.seconds:.0f}" if r.seconds is not None else "-") for r in managed.recoveries]
    if not rows:
        return None
    return format_table(("AT", "WHY", "RUN", "NEW RUN", "ZONE", "LAST STEP", "RESUMED AFTER", "LOST",
                         "SECONDS"), rows)


def stop_table(stops: list[Any]) -> str:
    rows = [(f"[{s.worker}]", s.outcome, s.signal or "-",
             "-" if s.exit_status is None else str(s.exit_status), s.error or "") for s in stops]
    return format_table(("WORKER", "OUTCOME", "SIGNAL", "EXIT", ""), rows)


def idle_record(minutes: int, idle: list[Any]) -> dict[str, Any]:
    return {"idle_after_minutes": minutes, "idle": [
        {"node": i.node.name, "provider": i.node.provider, "idle_since": i.idle_since.isoformat(),
         "idle_minutes": round(i.idle_for.total_seconds() / 60, 1),
         "cost_while_idle": i.cost_while_idle, "cost_so_far": i.cost_so_far} for i in idle]}


def idle_table(idle: list[Any], now: datetime) -> str:
    return format_table(("NODE", "PROVIDER", "IDLE SINCE", "IDLE FOR", "COST IDLE", "COST IN ALL"), [
        (i.node.name, i.node.provider, f"{i.idle_since:%Y-%m-%d %H:%M}",
         format_age(i.idle_since, now),
         "-" if i.cost_while_idle is None else f"~${i.cost_while_idle:,.2f}",
         "-" if i.cost_so_far is None else f"~${i.cost_so_far:,.0f}") for i in idle])


def metrics_table(answers: list[Any]) -> str:
    gib = float(1 << 30)
    rows = []
    for answer in answers:
        if answer.not_reported:
            rows.append((f"[{answer.worker}]", "-", "not reported", "-", answer.not_reported))
        for d in answer.devices:
            used = "-" if d.hbm_used_bytes is None else f"{d.hbm_used_bytes / gib:.1f}"
            total = "-" if d.hbm_total_bytes is None else f"{d.hbm_total_bytes / gib:.1f}"
            share = f" ({d.hbm_fraction:.0%})" if d.hbm_fraction is not None else ""
            duty = "-" if d.duty_cycle_pct is None else f"{d.duty_cycle_pct:.0f}%"
            warn = "near the limit" if d.hbm_fraction is not None and d.hbm_fraction >= 0.9 else ""
            rows.append((f"[{answer.worker}]", str(d.device), f"{used}/{total} GiB{share}", duty, warn))
    return format_table(("WORKER", "DEVICE", "HBM", "DUTY", ""), rows)


def sweep_table(param: str, trials: list[Any]) -> str:
    rows = [(str(t.value), str(t.local_batch), t.outcome, "-" if t.peak_gib is None else f"{t.peak_gib:.2f}",
             t.run_id or "-") for t in trials]
    return format_table((param.upper(), "LOCAL BATCH", "OUTCOME", "PEAK GiB", "RUN"), rows)


def compile_sweep_table(param: str, trials: list[Any]) -> str:
    rows = [(str(t.value), str(t.local_batch), "fits" if t.fits else "does not fit",
             "-" if t.peak_gib is None else f"{t.peak_gib:.2f}") for t in trials]
    return format_table((param.upper(), "LOCAL BATCH", "PLAN", "PEAK GiB"), rows)


def _size(n: float | None) -> str:
    """Bytes in about 5 characters: 1.23G, 45.6M, 12K (binary units), as the planner prints them."""
    if n is None:
        return "-"
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale:
            value = n / scale
            return f"{value:.2f}{unit}" if value < 10 else f"{value:.1f}{unit}" if value < 100 else (
                f"{value:.0f}{unit}")
    return str(int(n))


def plan_text(plan: dict[str, Any]) -> str:
    """The planner's JSON (python -m trainer plan --json) as its table: per chip, what is resident, and
    for each program its arguments, outputs, temporaries, aliases, peak held at once, compiler flops,
    bytes accessed, collectives and estimated time (a range, trainer/planner/estimate.py)."""
    from trainer.planner.estimate import Range, network_lines, step_lines
    hbm = plan.get("hbm_bytes") or 0
    slices = plan.get("slices") or 1
    where = f"{slices} x {plan['accelerator_type']}" if slices > 1 else plan["accelerator_type"]
    lines = [
        f"plan for {where} ({plan['topology']}{' each' if slices > 1 else ''}: {plan['hosts']} hosts, "
        f"{plan['chips']} chips, {hbm / 2**30:.2f} GiB HBM a chip as the compiler allows); "
        f"model {plan['model_source']}; mesh {plan['mesh']}; rollout weights {plan['weight_layout']}",
        "resident per chip: " + ", ".join(f"{k} {_size(v)}" for k, v in plan["resident_bytes"].items()),
        "",
    ]
    rows = []
    for p in plan["programs"]:
        if p.get("oom"):
            rows.append((p["name"], p["runs"], "OUT OF MEMORY", "", "", "", "", "", "", "", "", ""))
            continue
        est = Range.from_json(p.get("estimated_seconds"))
        rows.append((
            p["name"], p["runs"], _size(p["argument_bytes"]), _size(p["output_bytes"]),
            _size(p["temp_bytes"]), _size(p["alias_bytes"]), _size(p["peak_bytes"]),
            f"{p['flops'] / 1e9:.1f}",
            # What crosses HBM (trainer/planner/hbm_traffic.py); a plan cached before that has only bytes
            # accessed.
            f"{(p.get('hbm_traffic_bytes') or p['bytes_accessed']) / 1e9:.2f}",
            f"{p['collective_bytes'] / 1e6:.1f}", str(p["collectives"]),
            "-" if est is None else est.text(1e3),
        ))
    lines.append(format_table(("PROGRAM (PER CHIP)", "RUNS", "ARGS", "OUT", "TEMP", "ALIAS", "PEAK", "GFLOP",
                               "HBM GB", "COLL MB", "#COLL", "EST MS"), rows))
    for p in plan["programs"]:
        if p.get("oom"):
            lines.append(f"{p['name']}: out of memory: {p['oom']}")
    lines += ["", *step_lines(plan), *network_lines(plan), plan["verdict"]]
    return "\n".join(lines)
