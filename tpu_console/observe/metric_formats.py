"""The ways a command's progress is read (worker/step_lines.py parses each step-line format); a job file's
`[metrics] format` and `launch --metrics` name one, and the app's launch form lists them."""

from __future__ import annotations

from typing import Literal, get_args

# Where a command's steps are read from (worker/step_lines.py parses each); the app's launch form lists them.
MetricFormat = Literal["auto", "seeds", "maxtext", "jsonl", "loop", "tqdm", "keras", "regex", "none"]
METRIC_FORMATS: tuple[str, ...] = get_args(MetricFormat)
