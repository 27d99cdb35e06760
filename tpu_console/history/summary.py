"""A finished run in a few numbers, and runs side by side. Pure: no I/O.

The summary is what one reads out of W&B by hand after each benchmark run (a legacy vs maxtext
rollout-sharding comparison, say): step time averaged over the last 10 steps, valid tokens per second,
device memory in use and at peak, and the reward. Keys are the trainer's W&B metric names
(trainer/telemetry.py), so the
summary, events.jsonl and W&B say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpu_console.history.events import StepMetrics
from tpu_console.history.goodput import summary_metrics as goodput_metrics
from tpu_console.pricing import run_cost
from trainer import telemetry as tm


@dataclass(frozen=True)
class SummaryMetric:
    key: str  # the W&B name, as stored in the summary
    label: str  # what the comparison table calls it
    lower_is_better: bool


COST = "cost_usd"  # not a trainer metric: the console adds it from the node's price (pricing.run_cost)

# In the order the comparison table shows them. Memory and step time are the pod's worst worker (the
# slowest host sets the pace; the fullest device is the one that runs out); tokens/s and reward are
# gathered over every process by the trainer, so every worker reports the same value.
METRICS = (
    SummaryMetric(tm.STEP_AVG_LAST10, "step time, avg of last 10 (s)", lower_is_better=True),
    SummaryMetric(tm.VALID_TOKENS_PER_S, "valid tokens/s", lower_is_better=False),
    SummaryMetric(tm.MEM_IN_USE, "HBM in use, max over devices (GiB)", lower_is_better=True),
    SummaryMetric(tm.MEM_PEAK, "HBM peak, max over devices (GiB)", lower_is_better=True),
    SummaryMetric(tm.REWARD_MEAN, "reward mean (last step)", lower_is_better=False),
    SummaryMetric(tm.LOSS, "loss (last step)", lower_is_better=True),
    SummaryMetric(COST, "cost, chip-hours x price (USD)", lower_is_better=True),
    # goodput and each badput in percent of the run's time (history/goodput.py; added where it was read)
    *(SummaryMetric(key, label, lower) for key, label, lower in goodput_metrics()),
)


def summarize(last_steps: Mapping[int, StepMetrics | None]) -> dict[str, Any]:
    """The summary of a run from each worker's last step (None for a worker that finished none).
    A metric no worker reported (memory on CPU) is None, never a made-up number."""
    steps = [s for s in last_steps.values() if s is not None]

    def worst(values: list[float | None], lower_is_better: bool) -> float | None:
        known = [v for v in values if v is not None]
        if not known:
            return None
        return max(known) if lower_is_better else min(known)

    return {
        tm.STEP: max((s.step for s in steps), default=None),
        tm.STEP_AVG_LAST10: worst([s.step_avg_last10_s for s in steps], True),
        tm.VALID_TOKENS_PER_S: worst([s.tokens_per_s for s in steps], False),
        tm.MEM_IN_USE: worst([s.mem_in_use_gib for s in steps], True),
        tm.MEM_PEAK: worst([s.mem_peak_gib for s in steps], True),
        tm.MEM_LIMIT: worst([s.mem_limit_gib for s in steps], True),
        tm.REWARD_MEAN: worst([s.reward_mean for s in steps], False),
        tm.LOSS: worst([s.loss for s in steps], True),
    }


def run_summary(record: Any, last_steps: Mapping[int, StepMetrics | None]) -> dict[str, Any]:
    """A run's summary as the history keeps it once the run ended (else from each worker's latest step),
    with its cost: what `runs show`, `runs compare` and the app's runs screen show."""
    summary = record.summary or summarize(last_steps)
    return {**summary, COST: run_cost(record.price_per_hour, record.started_at, record.finished_at)}


def percent_change(base: float | None, other: float | None) -> float | None:
    if base is None or other is None or base == 0:
        return None
    return (other - base) / abs(base) * 100.0


def compare_rows(
    run_ids: Sequence[str], summaries: Sequence[Mapping[str, Any] | None]
) -> list[dict[str, Any]]:
    """One row per metric: the value of every run and, for each run after the first, its change against
    the first in percent (positive = larger). A metric no run has is left out."""
    rows = []
    for metric in METRICS:
        values = [(s or {}).get(metric.key) for s in summaries]
        if all(v is None for v in values):
            continue
        base = values[0]
        rows.append(
            {
                "metric": metric.key,
                "label": metric.label,
                "lower_is_better": metric.lower_is_better,
                "values": dict(zip(run_ids, values, strict=True)),
                "change_pct": {
                    run: percent_change(base, v) for run, v in zip(run_ids[1:], values[1:], strict=True)
                },
            }
        )
    return rows


def compare_table(
    run_ids: Sequence[str], summaries: Sequence[Mapping[str, Any] | None]
) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """Headers and cells of the comparison table: METRIC, A, B, `B vs A`, C, `C vs A` ..."""
    letters = [chr(ord("A") + i) if i < 26 else str(i) for i in range(len(run_ids))]
    headers = ["METRIC", f"A {run_ids[0]}"]
    for letter, run in zip(letters[1:], run_ids[1:], strict=True):
        headers += [f"{letter} {run}", f"{letter} VS A"]
    cells = []
    for row in compare_rows(run_ids, summaries):
        line = [row["label"], _number(row["values"][run_ids[0]])]
        for run in run_ids[1:]:
            line += [_number(row["values"][run]), _change(row["change_pct"][run])]
        cells.append(tuple(line))
    return tuple(headers), cells


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def _change(pct: float | None) -> str:
    return "-" if pct is None else f"{pct:+.1f}%"
