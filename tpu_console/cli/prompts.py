"""The questions the CLI asks before it destroys something, and the refusal when nobody can answer them
(`--json`, or no terminal) and `--yes` was not given."""

from __future__ import annotations

import sys

from tpu_console.domain import Node, QueuedRequest
from tpu_console.errors import UserError
from tpu_console.history import ownership
from tpu_console.history.store import RunRecord


def can_ask(json_mode: bool, *, stderr_too: bool = True) -> bool:
    """A person is there to answer: not --json, and stdin (and stderr, where the question goes) a terminal."""
    return not json_mode and sys.stdin.isatty() and (not stderr_too or sys.stderr.isatty())


def yes_no(question: str) -> bool:
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def confirm_delete(node: Node | QueuedRequest, name: str, *, yes: bool, json_mode: bool) -> None:
    """Deleting a node or a queued request: the person types its name (or passed --yes); UserError
    otherwise."""
    if yes:
        return
    if not can_ask(json_mode):
        raise UserError(f"refusing to delete {name} without --yes")
    what = "queued request" if isinstance(node, QueuedRequest) else "node"
    kind = f"{node.slices}x {node.accelerator_type}" if node.slices > 1 else node.accelerator_type
    typed = input(f"delete {node.provider} {what} {node.name} ({kind})? type its name to confirm: ")
    if typed.strip() != node.name:
        raise UserError(f"refusing to delete {name}: the name typed did not match (or pass --yes)")


def cancel_queued(requests: list[str], *, json_mode: bool) -> bool:
    """After Ctrl-C with queued requests out: cancel them? Yes unless a person at the terminal says no
    (a request left waiting keeps its place in the queue, and can hold quota)."""
    if not can_ask(json_mode):
        return True
    answer = input(f"cancel the queued request(s) {', '.join(requests)}? [Y/n] ").strip().lower()
    return answer not in ("n", "no")


def confirm_stop(record: RunRecord, *, yes: bool, json_mode: bool) -> None:
    """Stopping a run: y/N, or for another person's run its id typed back (or --yes); UserError otherwise."""
    if yes:
        return
    run_id = record.run_id
    theirs = not ownership.is_mine(record.launched_by)
    whose = f"{ownership.describe(record.launched_by)}'s run" if theirs else ""
    if not can_ask(json_mode):
        raise UserError(f"refusing to stop {run_id} without --yes" + (f": it is {whose}" if theirs else ""))
    if theirs:
        typed = input(f"run {run_id} on {record.node} is {whose}; type its run id to stop it: ").strip()
        if typed != run_id:
            raise UserError(f"not stopping {whose} {run_id}: the id typed did not match (or pass --yes)")
        return
    if not yes_no(f"stop run {run_id} on {record.node} (workers {record.workers})?"):
        raise UserError(f"not stopping {run_id}")
