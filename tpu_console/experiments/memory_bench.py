"""`tpu-console bench-memory NODE`: the FSDP all-gather memory bench on every worker, one case at a time.

Each case (a mesh shape and a mode) is one `python -m trainer bench-memory` process per worker, all
joined by jax.distributed like a run, in `~/tpu-console/bench/<id>/<case>/`; the cases run one after the
other so that no buffer of an earlier case is still held. The table shows, per case, the per-device bytes
of the buffer (max over every process) against what FSDP predicts: total / fsdp when sharded, total when
gathered; and device bytes in use / peak where the platform reports them.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import open_node, require_all_reachable
from tpu_console.fleet.run_recipes import python_word
from tpu_console.launch.start import launch_env
from tpu_console.providers.base import Provider, no_progress
from tpu_console.provision.worker_inspection import inspect_workers, worker_python

MODES = ("sharded", "gather")
GIB = float(1 << 30)
_EVENTS_MARK = "@@ events"



@dataclass
class CaseResult:
    mesh_shape: str
    mode: str
    ok: bool
    error: str | None = None
    bench: dict[str, Any] | None = None  # the `bench` event of process 0 (its *_max fields cover all)

    @property
    def matches_prediction(self) -> bool | None:
        if not self.bench:
            return None
        return self.bench["per_device_array_bytes_max"] == self.bench["expected_per_device_bytes"]


def case_command(python: str, folder: str, mesh_shape: str, mode: str, target_gib: float, cols: int) -> str:
    """Run one case in its own folder, then print the events the trainer wrote there."""
    args = [
        "bench-memory",
        "--mesh-shape",
        mesh_shape,
        "--mode",
        mode,
        "--target-bytes-gib",
        f"{target_gib:g}",
        "--cols",
        str(cols),
        "--run-dir",
        ".",
    ]
    d = '"$HOME"/' + shlex.quote(folder)
    return (
        f"mkdir -p {d} && cd {d} && {python_word(python)} -u -m trainer "
        f"{' '.join(shlex.quote(a) for a in args)} "
        f"> output.log 2>&1; s=$?; echo {shlex.quote(_EVENTS_MARK)}; cat events.jsonl 2>/dev/null; "
        "tail -n 3 output.log; exit $s"
    )


def _bench_event(stdout: str) -> tuple[dict | None, str | None]:
    _, _, tail = stdout.partition(_EVENTS_MARK + "\n")
    bench, last = None, None
    for line in tail.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        # output.log's tail follows the events: a line of it may parse as JSON without being an event (`42`).
        if not isinstance(event, dict):
            last = line.strip() or last
            continue
        if event.get("kind") == "bench":
            bench = event
        elif event.get("kind") == "error":
            last = event.get("message")
    return bench, last


async def bench_memory(
    providers: dict[str, Provider],
    node_name: str,
    mesh_shapes: Sequence[str] = ("auto", "host_local"),
    modes: Sequence[str] = MODES,
    target_bytes_gib: float = 5.6,
    cols: int = 4096,
    *,
    python: str | None = None,
    timeout_s: float = 600.0,
    progress: Callable[[str], None] = no_progress,
) -> list[CaseResult]:
    if target_bytes_gib <= 0 or cols <= 0:
        raise UserError("--target-bytes-gib and --cols must be positive")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise UserError(f"unknown mode {unknown[0]!r}; use sharded, gather or both")
    from trainer.mesh_shape import MeshError, resolve_mesh_shape

    provider, node = await open_node(providers, node_name)
    for shape in mesh_shapes:  # a mesh that does not fit is refused here, before any worker runs anything
        try:
            resolve_mesh_shape(shape, node.shape.total_devices, node.shape.workers)
        except MeshError as exc:
            raise UserError(f"{exc} ({node.name} has {node.shape.total_devices} devices)") from None
    workers = list(range(node.shape.workers))
    targets = await provider.ssh_targets(node)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    results = []
    async with Fleet(targets) as fleet:
        await require_all_reachable(fleet, node_name, workers, "nothing was run")
        reports = await inspect_workers(fleet, workers)
        interpreter = python or worker_python(provider, reports)
        if any(r.live_runs for r in reports):
            run_id = next(iter(next(r for r in reports if r.live_runs).live_runs))
            raise UserError(
                f"run {run_id} is still running on {node.name} and holds its devices; stop it first "
                f"with `tpu-console stop {node.name} {run_id}`"
            )
        for shape in mesh_shapes:
            for mode in modes:
                progress(
                    f"{node.name}: bench-memory mesh_shape={shape} mode={mode} on {len(workers)} worker(s)"
                )
                envs = launch_env(provider, node, fleet, workers)  # a fresh coordinator port per case
                folder = f"tpu-console/bench/{stamp}/{shape.replace(',', '_')}-{mode}"

                command = case_command(interpreter, folder, shape, mode, target_bytes_gib, cols)
                answers = await _run_everywhere(fleet, command, envs, workers, timeout_s)
                bench, error = None, None
                for answer in answers:
                    event, last = _bench_event(answer.stdout)
                    if not answer.ok:
                        error = (
                            error or f"worker {answer.worker}: {answer.error or last or answer.exit_status}"
                        )
                    if answer.worker == 0:
                        bench = event
                results.append(CaseResult(shape, mode, error is None and bench is not None, error, bench))
    return results


async def _run_everywhere(
    fleet: Fleet, command: str, envs: dict[int, dict[str, str]], workers: list[int], timeout_s: float
) -> list[Any]:
    """The same command on every worker at once, each with its own process id in the environment."""
    answers = await asyncio.gather(
        *(fleet.run(command, [w], env=envs[w], timeout=timeout_s) for w in workers)
    )
    return [answer for (answer,) in answers]


def table_rows(results: list[CaseResult]) -> list[tuple[str, ...]]:
    def gib(value: Any) -> str:
        return "-" if value is None else f"{value / GIB:.3f}"

    rows = []
    for r in results:
        b = r.bench or {}
        axes = b.get("mesh_axes", {})
        verdict = {True: "= predicted", False: "differs", None: r.error or "failed"}[r.matches_prediction]
        rows.append(
            (
                r.mesh_shape,
                r.mode,
                str(axes.get("dp", "-")),
                str(axes.get("fsdp", "-")),
                gib(b.get("total_bytes")),
                gib(b.get("per_device_array_bytes_max")),
                gib(b.get("expected_per_device_bytes")),
                gib(b.get("bytes_in_use_max")),
                gib(b.get("peak_bytes_in_use_max")),
                verdict,
            )
        )
    return rows


COLUMNS = ("MESH", "MODE", "DP", "FSDP", "TOTAL GiB", "PER-DEVICE GiB", "PREDICTED", "IN USE", "PEAK", "")
