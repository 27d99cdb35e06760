"""Progress of a job that knows nothing of tpu-console, beside its step lines: what its TensorBoard event
files and its W&B run folder say, read from the workers when a run is looked at.

A command job's step lines become step events on the worker itself (worker/job_runner.py with
worker/step_lines.py), so every view that reads events reads them. What a program writes elsewhere is read
here, console-side, from the places launch.json's `job.metrics` names (relative to the job's folder):
- `tensorboard`: a folder of TensorBoard event files (tunix writes its metrics only there). The files are
  copied (SFTP, only those that grew since the last copy) into `$TPU_CONSOLE_HOME/tensorboard/<run>/
  worker-<i>/` and read with tbparse, a maintained reader, into the last value of every scalar tag;
- `wandb`: the folder holding W&B's run folders (default `wandb`, where wandb puts them):
  `<run folder>/files/wandb-summary.json`, the numbers the seeds read back by hand after each run
  (`time/train/step_avg_last10_s`, `throughput/train/valid_tokens_per_s`, `memory/train/
  peak_bytes_in_use_max_gib`). They carry the trainer's metric names, so they fill the run's summary
  (`runs show`, `runs compare`) where its events say nothing.

Both folders live in the project's folder, which every run of that project shares, so a run reads only
what it wrote: the files modified after its launch.json was put in its run folder (before its job started)
and, once it has ended, not after its `exit` file (find's `-newer`, on the worker's own clock); of the W&B
summaries so written, the latest, never `latest-run` as such (a link to whichever run wrote last).

`steps_note` says where a run's steps come from, or that none of its output matched (yet, while it runs;
after the end, that none was recognised and how to give the program's with `--metrics`): shown instead of
an empty table or plot.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import shlex
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.errors import Unreachable, one_line
from tpu_console.fleet import run_recipes
from tpu_console.fleet.fleet import Fleet
from tpu_console.history.archive import archived_last_steps_in
from tpu_console.history.events import Event, StepMetrics
from tpu_console.observe.metric_formats import METRIC_FORMATS
from tpu_console.observe.reach import reach_node
from trainer import telemetry as tm

WANDB_DEFAULT = "wandb"
WANDB_SUMMARY = "files/wandb-summary.json"  # in each run folder (run-<time>-<id>/, offline-run-.../)
# What the seeds read from the summary by hand; shown first, in this order.
WANDB_KEYS = (tm.STEP_AVG_LAST10, tm.VALID_TOKENS_PER_S, tm.MEM_IN_USE, tm.MEM_PEAK)
TB_PATTERN = "events.out.tfevents.*"
MAX_TB_FILE = 256 << 20  # a larger event file holds images or histograms: not what a scalar view needs
BUILT_IN = ", ".join(f for f in METRIC_FORMATS if f not in ("auto", "regex", "none"))  # what auto reads


def command_job(record: Any) -> dict[str, Any] | None:
    """The run's `job` object when it is a command (any program); None for the bundled trainer."""
    job = getattr(record, "job", None)
    return job if isinstance(job, dict) and job.get("kind") == "command" else None


def _metrics(job: Mapping[str, Any]) -> dict[str, Any]:
    metrics = job.get("metrics")
    return metrics if isinstance(metrics, dict) else {}


def _in_job_folder(job: Mapping[str, Any], path: str) -> str:
    """A path the job file gives (relative to the job's folder) as a path on the worker (home-relative)."""
    if path.startswith("/"):
        return path
    if path.startswith("~/"):
        return path[2:]  # home-relative, as every other path here
    return posixpath.normpath(posixpath.join(job.get("cwd") or ".", path))


def wandb_dir(job: Mapping[str, Any]) -> str:
    return _in_job_folder(job, _metrics(job).get("wandb") or WANDB_DEFAULT)


def written_by_run(run_id: str, folder: str, tests: str, action: str) -> str:
    """A command that runs `find . TESTS ACTION` in `folder` (home-relative, or absolute) over the files the
    run wrote: modified after its launch.json, and not after its `exit` once there is one. Prints nothing
    where the folder or the run's folder is missing."""
    where = '"$HOME"/' + shlex.quote(folder) if not folder.startswith("/") else shlex.quote(folder)
    find = f'find . {tests} -newer "$run/launch.json"'
    return (f'( run="$HOME"/{shlex.quote(run_recipes.run_dir(run_id))}; [ -e "$run/launch.json" ] || exit 0; '
            f"cd {where} 2>/dev/null || exit 0; "
            f'if [ -e "$run/exit" ]; then {find} ! -newer "$run/exit" {action}; else {find} {action}; fi '
            "2>/dev/null; exit 0 )")


def tensorboard_dir(job: Mapping[str, Any]) -> str | None:
    folder = _metrics(job).get("tensorboard")
    return _in_job_folder(job, folder) if folder else None


def steps_read(record: Any) -> bool:
    """False for a command job whose output is not read for steps (metrics format none): its silence
    says nothing of a hang (the pod's supervisor judges it the same way)."""
    job = command_job(record)
    return job is None or _metrics(job).get("format") != "none"


def steps_note(record: Any, last_steps: Mapping[int, StepMetrics | None] | None,
               ended: bool = False) -> str | None:
    """Where the run's steps come from, for a command job: `steps from output.log (maxtext format)`, or
    that no line matched (so a view says so instead of drawing nothing): "yet" while it runs, how to give
    the step line once it ended (`ended`, or the record finished). None for the trainer, and when the
    workers' events are not known (`last_steps` None)."""
    job = command_job(record)
    if job is None or last_steps is None:
        return None
    metrics = _metrics(job)
    wanted = metrics.get("format") or "auto"
    if wanted == "none":
        return "steps: not read from the output (metrics format none)"
    found = sorted({s.format for s in last_steps.values() if s is not None and s.format})
    if found:
        return f"steps: from output.log ({', '.join(found)} format)"
    expected = {"auto": f"auto: {BUILT_IN}", "regex": f"regex {metrics.get('regex')!r}"}.get(wanted, wanted)
    if ended or getattr(record, "finished", False):
        return (f"steps: no step line was recognised in the output ({expected}); to read the program's, "
                "launch with --metrics 'REGEX' (a named group step, e.g. 'iter (?P<step>\\d+)') or set "
                "[metrics] regex in the job file")
    return (f"steps: no line of the output matched ({expected}) yet: launch with --metrics FORMAT|REGEX, or "
            "set [metrics] format or regex in the job file, to the program's step line")


def archived_last_steps(record: Any) -> dict[int, StepMetrics | None] | None:
    """Each worker's last step from the run's archive (history/archive.py), for a run that has ended; None
    when there is no archive."""
    folder = Path(record.archive_path) if getattr(record, "archive_path", None) else None
    if folder is None or not folder.is_dir():
        return None
    return archived_last_steps_in(folder, record.workers)


@dataclass
class ForeignReadings:
    """What a command job's TensorBoard files and W&B summary said, per worker."""

    wandb: dict[int, dict[str, float]] = field(default_factory=dict)  # the summary's numbers
    tensorboard: dict[int, dict[str, tuple[int, float]]] = field(default_factory=dict)  # tag: (step, last)
    problems: list[str] = field(default_factory=list)  # what could not be read, and why

    def lines(self) -> list[str]:
        """One line per worker and source, for `status` and `runs show`."""
        out = []
        for worker, values in sorted(self.wandb.items()):
            out.append(f"W&B worker {worker}: " + _some(_ordered(values, WANDB_KEYS)))
        for worker, tags in sorted(self.tensorboard.items()):
            step = max((s for s, _ in tags.values()), default=None)
            shown = {tag: value for tag, (_, value) in tags.items()}
            out.append(f"TensorBoard worker {worker} (step {step}, {len(tags)} tags): " + _some(shown))
        return out + [f"note: {p}" for p in self.problems]

    def to_json(self) -> dict[str, Any]:
        return {"wandb": {str(w): v for w, v in self.wandb.items()},
                "tensorboard": {str(w): {t: {"step": s, "value": v} for t, (s, v) in tags.items()}
                                for w, tags in self.tensorboard.items()},
                "problems": self.problems}


def complete_summary(summary: Mapping[str, Any], readings: ForeignReadings | None) -> dict[str, Any]:
    """The summary with what its events left empty taken from the W&B summaries (the same names): the
    worst worker's value, as summarize() takes it."""
    filled = dict(summary)
    if readings is None or not readings.wandb:
        return filled
    lower_is_better = {tm.STEP_AVG_LAST10: True, tm.VALID_TOKENS_PER_S: False, tm.MEM_IN_USE: True,
                       tm.MEM_PEAK: True, tm.REWARD_MEAN: False}
    for key, lower in lower_is_better.items():
        values = [v[key] for v in readings.wandb.values() if isinstance(v.get(key), int | float)]
        if filled.get(key) is None and values:
            filled[key] = max(values) if lower else min(values)
    return filled


async def read_foreign(
    fleet: Fleet, record: Any, workers: Sequence[int] | None = None, tensorboard: bool = True
) -> ForeignReadings:
    """The W&B summaries and (with `tensorboard`) TensorBoard scalars of a command job's workers (nothing
    for the trainer)."""
    readings = ForeignReadings()
    job = command_job(record)
    if job is None:
        return readings
    workers = list(record.workers if workers is None else workers)
    summaries = await asyncio.gather(*(_wandb_summary(fleet, job, record.run_id, w) for w in workers))
    for worker, (values, problem) in zip(workers, summaries, strict=True):
        if values:
            readings.wandb[worker] = values
        if problem:
            readings.problems.append(f"W&B summary of worker {worker}: {problem}")
    folder = tensorboard_dir(job) if tensorboard else None
    if folder is not None:
        for worker in workers:
            try:
                local = await fetch_tensorboard(fleet, record.run_id, folder, worker)
            except (Unreachable, OSError) as exc:
                readings.problems.append(f"TensorBoard files of worker {worker}: {one_line(exc)}")
                continue
            if local is None:
                readings.problems.append(f"worker {worker} has no TensorBoard event files in {folder} yet")
                continue
            if scalars := await asyncio.to_thread(last_scalars, local):
                readings.tensorboard[worker] = scalars
    return readings


async def _wandb_summary(
    fleet: Fleet, job: Mapping[str, Any], run_id: str, worker: int
) -> tuple[dict, str | None]:
    """The W&B summary this run wrote last on the worker (of the run folders' summaries it modified)."""
    folder = wandb_dir(job)
    listing = written_by_run(run_id, folder, f"-mindepth 3 -maxdepth 3 -path './*/{WANDB_SUMMARY}'",
                             "-printf '%T@ %P\\n'")
    try:
        (result,) = await fleet.run(listing, [worker], timeout=30)
        if not result.ok:
            raise Unreachable(result.error or result.stderr.strip() or f"exit {result.exit_status}")
        written = sorted((float(t), name) for t, _, name in (line.partition(" ") for line in
                         result.stdout.splitlines()) if name and ".." not in name.split("/"))
        if not written:
            # wandb was not used, or has not written its summary yet: only worth a word when it was asked for
            return {}, (f"no {folder}/*/{WANDB_SUMMARY} written by this run yet" if _metrics(job).get("wandb")
                        else None)
        path = posixpath.join(folder, written[-1][1])
        data = json.loads(await fleet.get(path, worker))
    except (Unreachable, OSError, ValueError) as exc:
        return {}, one_line(exc)
    if not isinstance(data, dict):
        return {}, f"{path} is not a JSON object"
    return {k: float(v) for k, v in data.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and not k.startswith("_")}, None


async def look(providers: Mapping[str, Any], record: Any) -> ForeignReadings | None:
    """`read_foreign` over a connection of its own (for `status` and `runs show`); None for the trainer
    or a node that cannot be reached (the run's view already says why)."""
    if command_job(record) is None:
        return None
    async with reach_node(dict(providers), record.node) as reached:
        if reached.fleet is None:
            return None
        return await read_foreign(reached.fleet, record)


def tensorboard_cache(run_id: str, worker: int) -> Path:
    return locations.home() / "tensorboard" / run_id / f"worker-{worker}"


async def fetch_tensorboard(fleet: Fleet, run_id: str, folder: str, worker: int) -> Path | None:
    """Copy the worker's event files under `folder` that this run wrote and that changed since the last
    copy; the local folder, or None when the worker has none."""
    listing = written_by_run(run_id, folder, f"-type f -name '{TB_PATTERN}'", "-printf '%s %P\\n'")
    (result,) = await fleet.run(listing, [worker], timeout=30)
    if not result.ok:
        raise Unreachable(result.error or result.stderr.strip() or f"exit {result.exit_status}")
    files = []
    for line in result.stdout.splitlines():
        size, _, name = line.partition(" ")
        if size.isdigit() and name and ".." not in name.split("/"):
            files.append((int(size), name))
    if not files:
        return None
    local = tensorboard_cache(run_id, worker)
    for size, name in files:
        target = local / name
        if size > MAX_TB_FILE or (target.exists() and target.stat().st_size == size):
            continue
        remote = f"{folder.rstrip('/')}/{name}"
        data = await fleet.get(remote, worker)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(data)
        partial.replace(target)
    return local


# TensorBoard tags that mean what a trainer's metric means (the tag's last part, as MaxText and tunix
# name them: `perf/step_time_seconds`, `learning/loss`); other tags keep their own name.
TB_NAMES = {
    "step_time": tm.phase_key("step"), "step_time_s": tm.phase_key("step"),
    "step_time_sec": tm.phase_key("step"), "step_time_seconds": tm.phase_key("step"),
    "loss": tm.LOSS, "reward_mean": tm.REWARD_MEAN, "valid_tokens_per_s": tm.VALID_TOKENS_PER_S,
}


def tensorboard_steps(folder: Path) -> list[StepMetrics]:
    """Every step of the scalars under `folder`, in step order, as the dashboard's steps: what its Steps
    and Plots tabs draw for a job whose metrics are only in TensorBoard (tunix)."""
    steps: dict[int, dict[str, Any]] = {}
    for tag, points in _scalars(folder).items():
        name = tag if tag.startswith(("time/", "throughput/", "memory/", "train-reward/")) else (
            TB_NAMES.get(tag.rsplit("/", 1)[-1], tag))
        for step, value in points:
            steps.setdefault(step, {"step": step, "format": "tensorboard"})[name] = value
    return [StepMetrics.from_event(Event("step", None, None, fields)) for _, fields in sorted(steps.items())]


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag's (step, value) points under `folder`, in step order, read with tbparse."""
    from tbparse import SummaryReader  # pandas and tensorboard: imported only when a job has event files

    with warnings.catch_warnings():  # tbparse's own use of a pandas keyword pandas plans to drop
        warnings.simplefilter("ignore")
        scalars = SummaryReader(str(folder)).scalars
    points: dict[str, list[tuple[int, float]]] = {}
    if scalars is None or scalars.empty:
        return points
    for row in scalars.sort_values("step").itertuples(index=False):
        points.setdefault(str(row.tag), []).append((int(row.step), float(row.value)))
    return points


def last_scalars(folder: Path) -> dict[str, tuple[int, float]]:
    """Every scalar tag's last (step, value) in the event files under `folder`."""
    return {tag: points[-1] for tag, points in _scalars(folder).items()}


def _ordered(values: Mapping[str, float], first: Sequence[str]) -> dict[str, float]:
    head = {k: values[k] for k in first if k in values}
    return {**head, **{k: v for k, v in sorted(values.items()) if k not in head}}


def _some(values: Mapping[str, float], most: int = 6) -> str:
    parts = [f"{k} {v:.4g}" for k, v in list(values.items())[:most]]
    more = len(values) - most
    return ", ".join(parts) + (f" (+{more} more)" if more > 0 else "") if parts else "nothing yet"
