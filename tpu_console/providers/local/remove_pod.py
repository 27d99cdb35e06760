"""Removing a local pod: the one home of its folder layout and of how its jobs are stopped, for
`LocalProvider.delete` here and for a run's supervisor on the pod, which runs this module as a command
(`python -m tpu_console.providers.local.remove_pod ROOT NAME`, the argv `supervisor_delete_target`
ships in supervision.json) instead of keeping a copy of the layout and the kill logic.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tpu_console.domain import NodeState
from tpu_console.providers.local.jobs import running_job_groups, stop_groups
from tpu_console.providers.local.store import PodStore


def job_groups(store: PodStore, name: str) -> list[int]:
    """The process groups of the jobs still running on every worker of pod `name`."""
    node = store.read(name)
    return [pgid for worker in range(node.shape.workers)
            for pgid in running_job_groups(store.worker_dir(name, worker))]


def command(root: Path, name: str) -> list[str]:
    """The argv that removes pod `name` of the store at `root`, with this console's interpreter."""
    return [sys.executable, "-m", __name__, str(root), name]


def remove(store: PodStore, name: str, grace_s: float = 3.0) -> None:
    """Mark the pod DELETING, stop its jobs (TERM, then KILL after `grace_s`), move its folder aside and
    remove it in the background (PodStore.remove)."""
    store.set_state(name, NodeState.DELETING)
    stop_groups(job_groups(store, name), grace_s)
    store.remove(name)


def main(argv: list[str]) -> int:
    root, name = argv
    remove(PodStore(Path(root)), name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
