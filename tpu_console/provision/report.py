"""The `@@ ` lines provisioning recipes print, turned into what the console shows and checks.

`@@ step TEXT` (progress), `@@ ready already|installed|synced`, `@@ error TEXT`, `@@ versions {json}`,
`@@ env present|missing`, `@@ code {json}`, `@@ python {json}`, `@@ project {json}`, `@@ setup {json}`,
`@@ missing`, `@@ live RUN_ID PGID`, `@@ killed PID NAME PATH`,
`@@ removed PATH`. Anything else is installer output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PREFIX = "@@ "
VERSION_KEYS = ("python", "jax", "jaxlib", "libtpu", "flax")
# What must be the same on every worker of a pod before a launch: a mixed pod fails in odd ways mid-run.
# `project` and `setup` are the digests of project.json and setup.json: a setup that failed on one worker
# leaves that worker's older setup.json, and the pod mixed.
MUST_MATCH = ("code", "jax", "jaxlib", "libtpu", "project", "setup")


@dataclass
class WorkerReport:
    """What one worker said about its environment."""

    worker: int
    ready: str | None = None  # already, installed, synced
    error: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    env_present: bool | None = None
    env_file_present: bool = False  # a `.env` left by `sync --env-file`
    code: dict[str, Any] | None = None
    python_info: dict[str, Any] | None = None  # python.json: the base interpreter bootstrap chose
    project: dict[str, Any] | None = None  # project.json: the project synced with sync --dir / --git
    setup: dict[str, Any] | None = None  # setup.json: the last setup that succeeded
    project_missing: bool = False  # `@@ missing`: the synced tree is not on this worker yet
    live_runs: dict[str, int] = field(default_factory=dict)  # run id -> process group
    killed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)  # `missing KEY` / `unwritable KEY` (launch/inputs.py)

    def add(self, line: str) -> str | None:
        """Take one line of output; returns the progress text it carries for a person, if any."""
        if not line.startswith(PREFIX):
            return None
        kind, _, rest = line[len(PREFIX):].partition(" ")
        if kind == "step":
            self.steps.append(rest)
            return rest
        if kind == "ready":
            self.ready = rest
            return {"already": "already in place", "installed": "installed", "synced": "code installed",
                    "unpacked": "project unpacked", "cloned": "project cloned"}.get(
                rest, rest
            )
        if kind == "error":
            self.error = rest
            return f"error: {rest}"
        if kind == "versions":
            self.versions = _json(rest) or {}
        elif kind == "env":
            self.env_present = rest == "present"
        elif kind == "envfile":
            self.env_file_present = rest == "present"
        elif kind == "code":
            self.code = _json(rest)
        elif kind == "python":
            self.python_info = _json(rest)
        elif kind == "project":
            self.project = _json(rest)
        elif kind == "setup":
            self.setup = _json(rest)
        elif kind == "missing":
            self.project_missing = True
        elif kind == "live":
            run_id, _, pgid = rest.partition(" ")
            if pgid.isdigit():
                self.live_runs[run_id] = int(pgid)
        elif kind == "killed":
            self.killed.append(rest)
            return f"killed stale TPU holder {rest}"
        elif kind == "input":
            self.inputs.append(rest)
        elif kind == "removed":
            self.removed.append(rest)
            return f"removed {rest}"
        return None

    @classmethod
    def parse(cls, worker: int, stdout: str) -> WorkerReport:
        report = cls(worker)
        for line in stdout.splitlines():
            report.add(line)
        return report

    @property
    def code_label(self) -> str:
        """The installed code as one word: `abc1234`, `abc1234+dirty`, `abc1234 (wheel 1f2e3d)`, or `-`."""
        return code_label(self.code)

    def versions_label(self) -> str:
        return " ".join(f"{k}={self.versions.get(k)}" for k in VERSION_KEYS if self.versions.get(k))

    def fingerprint(self) -> dict[str, str | None]:
        """The values that must match across a pod's workers."""
        return {
            "code": self.code_label,
            "project": (self.project or {}).get("digest"),
            "setup": (self.setup or {}).get("digest"),
            **{k: self.versions.get(k) for k in MUST_MATCH if k not in ("code", "project", "setup")},
        }


def code_label(code: dict[str, Any] | None) -> str:
    if not code:
        return "-"
    sha = str(code.get("git_sha") or "no-git")[:12]
    label = sha + ("+dirty" if code.get("dirty") else "")
    if code.get("wheel_sha256"):
        label += f" (wheel {str(code['wheel_sha256'])[:8]})"
    return label


def mismatches(reports: list[WorkerReport]) -> list[str]:
    """One line per value that differs across workers, naming each worker's value; empty if all agree."""
    lines = []
    for key in MUST_MATCH:
        values = {r.worker: r.fingerprint()[key] for r in reports}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"worker {w}: {v or 'none'}" for w, v in values.items())
            lines.append(f"{key} differs ({shown})")
    return lines


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
