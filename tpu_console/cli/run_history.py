"""`tpu-console runs show RUN` and `tpu-console runs compare RUN_A RUN_B ...`: one run from the history in
full, and several side by side (the table one writes by hand after each benchmark). Printing only;
the data comes from the runs layer; the sub-commands themselves are declared in cli/runs.py."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console.errors import UserError
from tpu_console.history import archive
from tpu_console.history.goodput import SUMMARY_KEYS, summary_fields
from tpu_console.history.resolve import resolve_run
from tpu_console.history.store import RunStore
from tpu_console.history.summary import METRICS, compare_rows, compare_table, run_summary
from tpu_console.observe import foreign_metrics, lookup
from tpu_console.observe.foreign_metrics import ForeignReadings, complete_summary
from tpu_console.observe.goodput_report import run_goodput
from tpu_console.observe.lookup import RunView
from tpu_console.providers.base import Provider
from tpu_console.secrets import SecretMasker
from tpu_console.views import runs as run_table
from tpu_console.views.nodes import format_age, format_table


def _summary(view: RunView, foreign: ForeignReadings | None = None) -> dict[str, Any]:
    """The stored summary once the run ended, else one from each worker's latest step now; what the
    events leave empty from a command job's W&B summaries (`foreign`)."""
    summary = run_summary(view.record, {s.worker: s.events.last_step for s in view.workers})
    return complete_summary(summary, foreign)


def rollout_layout(view: RunView) -> dict[str, Any] | None:
    """The rollout layout the trainer chose (its `start` event's `rollout_layout`): from the workers' events
    while the run is live, from its archive once it has ended; None for other jobs and older trainers."""
    starts = [s.events.start for s in view.workers if s.events.start is not None]
    record = view.record
    if not starts and record.archive_path and Path(record.archive_path).is_dir():
        found = archive.archived_start_in(Path(record.archive_path), record.workers)
        starts = [found] if found is not None else []
    layout = starts[0].get("rollout_layout") if starts else None
    return layout if isinstance(layout, dict) else None


def rollout_layout_line(layout: dict[str, Any]) -> str:
    """`runs show`'s line for the layout: what decode ran (how many copies of its weights, where more than
    one) and why; where the rows lived for a trainer that recorded it (one that split them every way it
    could; today's split them over every device)."""
    copies = layout.get("copies") or 1
    weights = f"{layout.get('weight_layout')} weights" + (f" ({copies} copies)" if copies > 1 else "")
    rows = f", rows {layout['rows']}" if layout.get("rows") else ""
    return f"rollout   {weights}{rows} ({layout.get('why')})"


async def show(targets: Sequence[str], json_mode: bool, providers: dict[str, Provider]) -> int:
    if not 1 <= len(targets) <= 2:
        raise UserError("runs show takes a run id, or a node and optionally one of its runs: "
                        "`tpu-console runs show RUN_ID`")
    store = RunStore()
    record = await resolve_run(store, providers, targets[0], targets[1] if len(targets) > 1 else None)
    view = await lookup.show_run(providers, record, store)
    record = view.record
    foreign = view.foreign  # read in the same look as the run's state
    last_steps = ({s.worker: s.events.last_step for s in view.workers} if view.live
                  else foreign_metrics.archived_last_steps(record))
    steps_note = foreign_metrics.steps_note(record, last_steps)
    summary = _summary(view, foreign)
    masker = SecretMasker.for_node(record.node)
    decisions = view.decisions if view.decisions is not None else await lookup.supervisor_decisions(
        providers, record)
    goodput = await run_goodput(providers, record, store, decisions)
    summary.update(summary_fields(goodput))
    layout = rollout_layout(view)
    managed = await _managed_run(record.run_id)  # handed to the controller: its incarnations, recoveries
    if json_mode:
        document = {**run_table.run_record(view), "summary": summary, "archive_path": record.archive_path,
                    "managed": managed.to_json() if managed is not None else None,
                    "rollout_layout": layout,
                    "goodput": goodput.to_json() if goodput is not None else None,
                    "steps_source": steps_note,
                    "foreign_metrics": foreign.to_json() if foreign is not None else None,
                    "supervisor": None if decisions is None else [
                        {"t": d.t, "decision": d.decision, "message": d.message, **d.fields}
                        for d in decisions]}
        print(masker.mask(json.dumps(document, indent=2)))
        return 0
    now = datetime.now(UTC)
    finished = f", ended {format_age(record.finished_at, now)} ago" if record.finished_at else ""
    lines = [
        f"{record.run_id}  {view.state}",
        (
            f"node      {record.node} ({record.provider} {record.accelerator_type}), workers "
            f"{','.join(str(w) for w in record.workers)}"
        ),
        (
            f"started   {record.started_at.isoformat(timespec='seconds')} "
            f"({format_age(record.started_at, now)} ago"
            f"{finished})"
        ),
        f"config    {record.config_path} (digest {record.config_digest[:12]})"
        + (f" --set {' --set '.join(record.overrides)}" if record.overrides else ""),
        f"code      {record.code_text()}",
        f"archive   {record.archive_path or '- (copied when the run ends)'}",
    ]
    if layout is not None:
        lines.append(rollout_layout_line(layout))
    if view.failure:
        lines.append(f"failure   {view.failure}")
    print(masker.mask("\n".join(lines)))
    print()
    print(
        masker.mask(format_table(run_table.WORKER_COLUMNS, [run_table.worker_row(s) for s in view.workers]))
    )
    print()
    # only what the run has: a program with no reward, or memory on CPU, gets no row of dashes
    rows = [(m.label, _value(summary.get(m.key))) for m in METRICS
            if m.key not in SUMMARY_KEYS and summary.get(m.key) is not None]
    print(format_table(("SUMMARY", ""), rows) if rows else "summary   - (no step metric has been read)")
    print()
    if goodput is not None:  # history/goodput.py: the run's time, productive and by cause of badput
        print(format_table(("GOODPUT", "TIME", "SHARE"), goodput.rows()))
        print(goodput.line())
    else:
        print("goodput   - (the run's steps cannot be read: no archive and its node is out of reach)")
    extra = ([steps_note] if steps_note else []) + (foreign.lines() if foreign is not None else [])
    if extra:
        print()
        print(masker.mask("\n".join(extra)))
    if decisions:
        print()
        print(masker.mask("\n".join(f"supervisor  {d.message}" for d in decisions)))
    if managed is not None:
        from tpu_console.views.managed import incarnation_lines

        print()
        print("\n".join(incarnation_lines(managed)))
    if view.problem:
        print(f"note: {view.problem}", file=sys.stderr)
    return 0


async def _managed_run(run_id: str) -> Any:
    """The managed run that ran `run_id` in one of its incarnations, or None (controller's store)."""
    from tpu_console.cli.controller import managed_run_of
    from tpu_console.settings import load_settings

    return await asyncio.to_thread(managed_run_of, run_id, load_settings())


async def compare(targets: Sequence[str], json_mode: bool, providers: dict[str, Provider]) -> int:
    if len(targets) < 2:
        raise UserError("runs compare needs two runs or more: `tpu-console runs compare RUN_A RUN_B`")
    store = RunStore()
    views = []
    for target in targets:
        record = await resolve_run(store, providers, target)
        views.append(await lookup.show_run(providers, record, store))
    run_ids = [v.record.run_id for v in views]
    if len(set(run_ids)) < len(run_ids):
        raise UserError(f"a run is named twice ({', '.join(run_ids)}); compare different runs")
    foreign = [await foreign_metrics.look(providers, v.record) if v.live else None for v in views]
    summaries = [_summary(v, f) for v, f in zip(views, foreign, strict=True)]
    goodputs = [await run_goodput(providers, v.record, store) for v in views]
    for summary, goodput in zip(summaries, goodputs, strict=True):
        summary.update(summary_fields(goodput))
    if json_mode:
        print(
            json.dumps(
                {
                    "runs": [
                        {"run_id": v.record.run_id, "state": v.state, "summary": s,
                         "goodput": g.to_json() if g is not None else None}
                        for v, s, g in zip(views, summaries, goodputs, strict=True)
                    ],
                    "rows": compare_rows(run_ids, summaries),
                },
                indent=2,
            )
        )
        return 0
    headers, cells = compare_table(run_ids, summaries)
    print(format_table(headers, cells))
    unfinished = [v.record.run_id for v in views if not v.record.finished]
    if unfinished:
        print(f"note: {', '.join(unfinished)} not finished: their latest step is shown", file=sys.stderr)
    return 0


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
