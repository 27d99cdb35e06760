"""Colours that mean the same on every screen (nvitop-like: green fine, yellow look, red act)."""

from __future__ import annotations

from tpu_console.domain import NodeState

NODE_STATE_STYLES = {
    NodeState.READY: "green", NodeState.CREATING: "yellow", NodeState.STARTING: "yellow",
    NodeState.PREEMPTED: "bold red", NodeState.TERMINATED: "red", NodeState.DELETING: "dim",
}
RUN_STATE_STYLES = {"running": "cyan", "pending": "cyan", "succeeded": "green", "failed": "red",
                    "partially-dead": "bold red", "stopped": "yellow"}
