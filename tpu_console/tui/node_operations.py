"""What the nodes screen's operations do, once their form or question is answered: create, delete (a node or
a queued request), bootstrap, sync, launch (with the tiny inputs first when asked), stop. Each is an async
body that reports lines through `say` and returns its outcome line; the screen (screens/nodes_screen.py)
runs it in the background and shows both in the operations panel. Raising reports a failure there:
`UserError` as refused, anything else as failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from tpu_console.domain import Node, QueuedRequest
from tpu_console.errors import CreateInterrupted, UserError
from tpu_console.history import prep_log
from tpu_console.history.store import RunRecord, RunStore
from tpu_console.providers.base import Provider
from tpu_console.providers.nodes import cancel_queued, create_node, delete_node, delete_request
from tpu_console.tui.modals.create_node import CreateOrder
from tpu_console.tui.modals.launch import LaunchOrder
from tpu_console.tui.modals.sync import SyncOrder

# What an operation's body is given to report a line: `say(text)` or `say(text, style)`.
Say = Callable[..., None]
Operation = Callable[[Say], Awaitable[str]]
Providers = dict[str, Provider]


def timed(node: str, kind: str, operation: Operation) -> Operation:
    """The operation, keeping when it ran on the node (history/prep_log.py): a run's goodput counts it."""

    async def run(say: Say) -> str:
        return await prep_log.timed(node, kind, operation(say))

    return run


def queues(accelerator_type: str) -> bool:
    """Does a gcp create of this type wait in a queue (and so may be cancelled with esc)?"""
    from tpu_console.providers.gcp.accelerators import canonical_type
    from tpu_console.providers.gcp.queued_mapping import supports_queued

    try:
        return supports_queued(canonical_type(accelerator_type))
    except UserError:
        return False


async def create(providers: Providers, order: CreateOrder, say: Say) -> str:
    try:
        node = await create_node(providers, order.provider, order.request, progress=say)
    except CreateInterrupted as interrupted:  # esc, and the person said cancel
        say(f"cancelling queued request(s) {', '.join(interrupted.requests)}")
        await cancel_queued(providers, interrupted, progress=say)
        return "cancelled: the queued request is deleted, confirmed gone"
    where = f" in {node.zone}" if node.zone else ""
    return f"{node.name} is {node.state.value}{where}"


async def delete_queued_request(providers: Providers, request: QueuedRequest, say: Say) -> str:
    await delete_request(providers, request, progress=say)  # this row's zone, not another's
    return f"queued request {request.name} in {request.zone} deleted"


async def delete(providers: Providers, node: Node, say: Say) -> str:
    await delete_node(providers, node.name, progress=say)
    return f"{node.name} deleted"


async def bootstrap(providers: Providers, node: Node, say: Say) -> str:
    from tpu_console.provision.bootstrap import bootstrap_node

    result = await bootstrap_node(
        providers,
        node.name,
        progress=say,
        on_worker=lambda worker, text: say(f"[{worker}] {text}"),
    )
    return _setup_outcome(result, "bootstrapped", say)


async def sync(providers: Providers, node: Node, order: SyncOrder, say: Say) -> str:
    from tpu_console.provision.code_sync import sync_node

    result = await sync_node(
        providers,
        node.name,
        env_file=order.env_file,
        git_url=order.git_url,
        branch=order.branch,
        progress=say,
        on_worker=lambda worker, text: say(f"[{worker}] {text}"),
    )
    return _setup_outcome(result, "synced", say)


async def launch(providers: Providers, node: Node, order: LaunchOrder, say: Say, *, store: RunStore | None,
                 webhook_url: str | None):
    """Launch the order's run on every worker; returns the launch's result (its run id, its workers)."""
    from tpu_console.experiments.planning import launch_check
    from tpu_console.launch.start import launch as launch_run

    if order.make_inputs:
        await _make_tiny_inputs(providers, node, order, say)
    result = await launch_run(
        providers,
        node.name,
        order.config_path if order.job is None else None,
        order.overrides,
        order.env_file,
        kill_stale=order.kill_stale,
        fail_fast=order.fail_fast,
        policy=order.policy,
        webhook_url=webhook_url,
        # the plan again (cached): the form may have been submitted before its plan came back
        before_send=launch_check(say) if order.plan_check and order.job is None else None,
        job=order.job,  # a job file or a command of your own instead of the trainer
        store=store,
        progress=say,
        on_worker=lambda worker, text: say(f"[{worker}] {text}"),
    )
    for start in result.starts:
        say(
            f"[{start.worker}] "
            + (f"started, pgid {start.pgid}" if start.ok else f"failed: {start.error}"),
            "" if start.ok else "red",
        )
    if not result.ok:
        raise RuntimeError("the job did not start on every worker; nothing is left running")
    return result


async def _make_tiny_inputs(providers: Providers, node: Node, order: LaunchOrder, say: Say) -> None:
    """The launch form's offer for the tiny configs: `tpu-console demo` before the launch."""
    from tpu_console.launch.demo import make_tiny_inputs

    made = await make_tiny_inputs(
        providers,
        node.name,
        order.config_path,
        order.overrides,
        progress=say,
        on_worker=lambda worker, text: say(f"[{worker}] {text}"),
    )
    failed = [w for w in made.workers if not w.ok]
    for worker in failed:
        say(f"[{worker.worker}] failed: {worker.error}", "red")
    if failed:
        raise RuntimeError(f"the tiny model and data could not be made on worker {failed[0].worker}: "
                           f"{failed[0].error}; nothing was launched")


async def stop(providers: Providers, record: RunRecord, say: Say, *, store: RunStore | None) -> str:
    from tpu_console.launch.stop import stop as stop_run

    view, stops = await stop_run(providers, record.run_id, store=store)
    for s in stops:
        signal = f" by {s.signal}" if s.signal else ""
        status = "" if s.exit_status is None else f", exit {s.exit_status}"
        say(f"[{s.worker}] {s.outcome}{signal}{status}" + (f": {s.error}" if s.error else ""))
    return f"run {view.state}"


def _setup_outcome(result, done: str, say: Say) -> str:
    """The outcome line of a bootstrap or sync; every failed worker is named in the panel first."""
    failed = [w for w in result.workers if not w.ok]
    for worker in failed:
        say(f"[{worker.worker}] failed: {worker.error}", "red")
    if failed:
        raise RuntimeError(
            f"worker {failed[0].worker}: {failed[0].error} ({len(failed)} of {len(result.workers)} failed)"
        )
    first = result.workers[0] if result.workers else None
    return f"{done} {len(result.workers)} worker(s)" + (f": {first.report.versions_label()}" if first else "")
