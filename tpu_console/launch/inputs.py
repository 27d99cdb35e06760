"""The files a job reads and writes, checked on every worker before a launch.

`model_path` and `data.path` name a local file or folder, a Hugging Face hub id, or a `gs://` path;
`checkpoint.dir` a folder or a `gs://` path. What can be judged here is (a hub id or a `gs://` path must
be well-formed; a local path must be absolute or under `~`, since the job runs in its new run folder);
whether a local path exists, and whether the checkpoint folder is writable, is asked of every worker in the
round trip of the launch's other checks (`fleet/recipes.check_inputs`), so a doomed job never starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_console.domain import Node
from tpu_console.errors import UserError

# Hugging Face's rules for a repository id: `name` or `owner/name`, letters, digits, `-`, `_`, `.`,
# at most 96 characters a part, no `--` or `..`, neither starting nor ending with `-` or `.`.
_HUB_PART = r"[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?:{_HUB_PART}/)?{_HUB_PART}$")
# gs://BUCKET[/OBJECT]: a bucket is 3-222 characters of lowercase letters, digits, `-`, `_` and `.`.
_GS_PATH = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](?:/.*)?$")


@dataclass(frozen=True)
class JobInput:
    key: str  # the config key: model_path, data.path, checkpoint.dir
    path: str
    need: str  # exists, file, writable (as fleet/recipes.check_inputs takes it)

    def fix(self, node: str) -> str:
        if self.key == "model_path":
            return (f"make the tiny model there with `tpu-console demo {node}`, or point model_path at a "
                    "model folder every worker has (or a hub id)")
        if self.key == "data.path":
            return (f"write synthetic data there with `tpu-console demo {node}`, or point data.path at a "
                    "file every worker has (or the hub id openai/gsm8k)")
        return "pick a checkpoint.dir the workers can write (or a gs:// path)"


def _is_local(text: str) -> bool:
    from trainer.config import is_local_path

    return not text.startswith("gs://") and is_local_path(text)


def job_inputs(config: Any) -> list[JobInput]:
    """The local paths of a validated TrainerConfig that every worker must have (or be able to write).
    UserError for a reference that cannot be right anywhere: a malformed hub id or gs:// path, or a
    relative local path (the job runs in its run folder, which is new)."""
    found = []
    for key, text, need in (
        ("model_path", config.model_path, "exists"),
        ("data.path", config.data.path, "file"),
        ("checkpoint.dir", config.checkpoint.dir, "writable"),
    ):
        if text is None:
            continue
        if text.startswith("gs://"):
            if not _GS_PATH.match(text):
                raise UserError(f"{key}: {text!r} is not a well-formed gs:// path; write gs://BUCKET/PATH")
        elif key != "checkpoint.dir" and not _is_local(text):
            if not _HUB_ID.match(text) or "--" in text or ".." in text:
                raise UserError(
                    f"{key}: {text!r} is neither a local path (start it with / or ~/) nor a well-formed hub "
                    "id (owner/name, e.g. Qwen/Qwen2.5-0.5B-Instruct)"
                )
        elif not text.startswith(("/", "~/")):
            if key == "checkpoint.dir":
                continue  # inside the run's own folder, which the launch makes
            raise UserError(
                f"{key}: {text} is relative, but the job runs in its new run folder "
                f"(~/tpu-console/runs/<run_id>/); give an absolute path or one under ~/, e.g. ~/{text}"
            )
        else:
            found.append(JobInput(key, text, need))
    return found


def refuse_missing(node: Node, inputs: Sequence[JobInput], said: dict[int, list[str]]) -> None:
    """UserError naming each input a worker lacks (from its `@@ input` lines), the workers, and the fix."""
    problems = []
    for item in inputs:
        missing = sorted(w for w, lines in said.items() if f"missing {item.key}" in lines)
        unwritable = sorted(w for w, lines in said.items() if f"unwritable {item.key}" in lines)
        for workers, what in ((missing, "does not exist"), (unwritable, "is not writable")):
            if workers:
                where = "any worker" if len(workers) == len(said) > 1 else _workers(workers)
                problems.append(f"{item.key} {item.path} {what} on {where} of {node.name}: "
                                f"{item.fix(node.name)}")
    if problems:
        raise UserError("; ".join(problems) + "; nothing was launched")


def _workers(workers: list[int]) -> str:
    return ("worker " if len(workers) == 1 else "workers ") + ", ".join(map(str, workers))
