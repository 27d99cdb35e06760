"""A run's record as written once, at launch: `launch.json` in each worker's run folder (docs/contract.md).

Every reader goes through `LaunchRecord`: the job runner and the supervisor on the pod (the supervisor
takes the run's id, node, provider, workers, start, price and fail-fast from it alone), and in the console
the history (history/store.py builds its entry from it), the runs found on a node (history/discovery.py)
and the record the supervisor leaves in a bucket (history/bucket_record.py), which embeds this record as
its `launch`. A record of an older version reads with what it lacks defaulted; one of a newer version
than this file knows is refused with a one-line `RecordError` (that console is older than the run).

Each worker's copy is the same record with its own `worker` and `env` (the non-secret variables of its
job; secrets are in the run's `.env`, never here).

Python 3.8+ and the standard library only: it ships to the workers beside the supervisor.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

FILE = "launch.json"
# 1: the records written before this field existed; 2: every key below, `config_source` and
# `config_digest` for every kind of job, `price_per_hour` and `managed`.
SCHEMA = 2


class RecordError(ValueError):
    """A record this version cannot read: its message is one line saying what to do."""


@dataclass(frozen=True)
class LaunchRecord:
    run_id: str
    node: str
    provider: str = "?"
    accelerator_type: str = "?"
    workers: list[int] = field(default_factory=list)  # the workers launched
    slices: int = 1  # the slices the run spans (a multislice, or some of its slices after a shrink)
    started_at: str = ""  # ISO 8601, with its zone
    python: str = ""  # the interpreter the job runs with, as far as the console knows it
    command: list[str] = field(default_factory=list)  # the argv the job runner starts
    config_source: str = ""  # the trainer's config file, the job file, or the command line
    config_digest: str = ""  # the trainer config's digest (its `start` event says the same), or the job's
    overrides: list[str] = field(default_factory=list)  # the trainer's --set KEY=VALUE
    config: dict[str, Any] | None = None  # the trainer's config as sent, every key; None for a command
    code_version: dict[str, Any] | None = None  # the console checkout's {git_sha, dirty}
    job: dict[str, Any] | None = None  # what ran, where, from which project and setup (docs/contract.md)
    launched_by: dict[str, Any] | None = None  # {user, host, home} (history/ownership.py)
    fail_fast: bool = False
    supervised: bool = False
    price_per_hour: float | None = None  # the node's price when launched; None where unknown
    managed: dict[str, Any] | None = None  # {run, incarnation} when a managed run's controller launched it
    worker: int | None = None  # this copy's worker (None: the record as the console keeps it)
    env: dict[str, str] = field(default_factory=dict)  # this worker's non-secret job environment
    env_file: str | None = None  # the run folder's .env, or the synced one it copied; None without

    def for_worker(self, worker: int, env: dict[str, str], env_file: str | None) -> LaunchRecord:
        """One worker's copy."""
        return replace(self, worker=worker, env=dict(env), env_file=env_file)

    @property
    def kind(self) -> str:
        """`trainer` or `command` (a record from before `job` existed ran the trainer)."""
        return str((self.job or {}).get("kind") or "trainer")

    @property
    def steps_read(self) -> bool:
        """False for a command whose output is not read for steps (its metrics format is none)."""
        metrics = (self.job or {}).get("metrics")
        return not (self.kind == "command" and isinstance(metrics, dict) and metrics.get("format") == "none")

    @property
    def code_text(self) -> str | None:
        """The console's commit, `SHA` or `SHA+dirty`; None outside a checkout."""
        if not self.code_version:
            return None
        dirty = "+dirty" if self.code_version.get("dirty") else ""
        return str(self.code_version.get("git_sha") or "") + dirty

    def started(self) -> datetime | None:
        """`started_at` as a datetime (UTC when it names no zone), None when absent or unreadable."""
        try:
            moment = datetime.fromisoformat(self.started_at)
        except (TypeError, ValueError):
            return None
        return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)  # noqa: UP017 - 3.8 has no UTC

    def to_json(self) -> dict[str, Any]:
        data = {"schema": SCHEMA, **asdict(self)}
        if self.config is None:
            del data["config"]  # a command has no trainer config
        return data

    def dumps(self) -> bytes:
        return json.dumps(self.to_json(), indent=2).encode() + b"\n"

    @classmethod
    def from_json(cls, data: Any, run_id: str = "", node: str = "") -> LaunchRecord:
        """The record in `data` (launch.json as parsed), what it lacks defaulted (`run_id`, `node`: the
        folder's and the node's, where an old record does not say). RecordError when it is not a record,
        or is of a newer version."""
        if not isinstance(data, dict):
            raise RecordError(f"{FILE} of run {run_id or '?'} is not a JSON object")
        schema = data.get("schema", 1)
        if not isinstance(schema, int) or not 1 <= schema <= SCHEMA:
            raise RecordError(
                f"{FILE} of run {data.get('run_id') or run_id or '?'} has schema {schema!r}, which this "
                f"tpu-console does not know (it reads 1 to {SCHEMA}); update tpu-console to read it")
        job = _dict(data.get("job"))
        command = [str(word) for word in _list((job or {}).get("command") or data.get("command"))]
        slices = data.get("slices")
        price = data.get("price_per_hour")
        return cls(
            run_id=str(data.get("run_id") or run_id),
            node=str(data.get("node") or node),
            provider=str(data.get("provider") or "?"),
            accelerator_type=str(data.get("accelerator_type") or "?"),
            workers=[w for w in _list(data.get("workers")) if isinstance(w, int) and not isinstance(w, bool)],
            slices=slices if isinstance(slices, int) and slices > 0 else 1,
            started_at=str(data.get("started_at") or ""),
            python=str(data.get("python") or ""),
            command=command,
            # schema 1 named its source for the trainer only: a command's is its job file or command line
            config_source=str(data.get("config_source") or (job or {}).get("job_file")
                              or shlex.join(command)),
            config_digest=str(data.get("config_digest") or ""),
            overrides=[str(o) for o in _list(data.get("overrides"))],
            config=_dict(data.get("config")),
            code_version=_dict(data.get("code_version")),
            job=job,
            launched_by=_dict(data.get("launched_by")),
            fail_fast=bool(data.get("fail_fast")),
            supervised=bool(data.get("supervised")),
            price_per_hour=float(price) if isinstance(price, (int, float)) and not isinstance(price, bool)
            else None,
            managed=_dict(data.get("managed")),
            worker=data["worker"] if isinstance(data.get("worker"), int) else None,
            env={str(k): str(v) for k, v in (_dict(data.get("env")) or {}).items()},
            env_file=data["env_file"] if isinstance(data.get("env_file"), str) else None,
        )

    @classmethod
    def loads(cls, text: Any, run_id: str = "", node: str = "") -> LaunchRecord:
        """From launch.json's text; RecordError when it is not JSON."""
        try:
            data = json.loads(text)
        except ValueError:
            raise RecordError(f"{FILE} of run {run_id or '?'} is not JSON") from None
        return cls.from_json(data, run_id, node)


def load(folder: str) -> LaunchRecord:
    """The record in a run folder; RecordError (one line) when it has none, or none this version can read."""
    run_id = os.path.basename(os.path.abspath(folder))
    try:
        with open(os.path.join(folder, FILE), "rb") as f:
            text = f.read()
    except OSError as exc:
        raise RecordError(f"run {run_id} has no readable {FILE} ({exc.strerror}): launch writes it "
                          "first; launch the run again") from None
    return LaunchRecord.loads(text, run_id)


def read(folder: str) -> LaunchRecord | None:
    """The record in a run folder; None when it has none, or none this version can read."""
    try:
        return load(folder)
    except RecordError:
        return None


def _dict(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []
