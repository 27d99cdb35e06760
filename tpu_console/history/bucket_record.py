"""A run's record that outlives its node: where the supervisor on the pod writes it, and how `runs` reads
it back into this console's history.

The supervisor (worker/supervisor.py) writes `<path>/runs/<run_id>.json` when the run ends and again just
before it deletes the node: the run's record as launched (`launch`, launch.json by its one schema,
worker/run_record.py), its decisions (supervisor.jsonl), each worker's exit status, last step event and
last lines of output. Where: `[gcp] bucket = "gs://BUCKET[/PATH]"` (PATH defaults to
`tpu-console`), uploaded with the VM's own credentials through Cloud Storage's JSON API; or, for local
pods, a folder standing for the bucket (`file:///FOLDER`, else `run-records/` in this console's home).
`STORAGE_EMULATOR_HOST` (as google-cloud-storage reads it) points both sides at an emulator.

The history database is a cache of what was seen: `merge` adds the records of runs it does not know (a
colleague's, or one from before this home was wiped) and ends the ones it still thought were running.
A bucket that cannot be read is a warning, never a failure of the listing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.errors import NotFound, UserError
from tpu_console.history.events import StepMetrics, parse_event_line
from tpu_console.history.run_id import is_run_id
from tpu_console.history.store import RunRecord, RunStore, WorkerRecord
from tpu_console.history.summary import summarize
from tpu_console.secrets import MIN_SECRET_LENGTH
from tpu_console.settings import Settings
from tpu_console.worker.run_record import LaunchRecord, RecordError

TAIL_LINES = 20  # the last lines of each worker's output the record keeps
DEFAULT_PATH = "tpu-console"
GCS_ENDPOINT = "https://storage.googleapis.com"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
LOCAL_FOLDER = "run-records"  # in the console's home: local pods' stand-in for the bucket
READ_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Bucket:
    kind: str  # "gcs" or "folder"
    name: str  # the bucket, or the folder's path
    prefix: str  # object names start with it: "<path>/runs/"

    @property
    def place(self) -> str:
        return f"gs://{self.name}/{self.prefix}" if self.kind == "gcs" else str(Path(self.name) / self.prefix)


def parse_bucket(text: str) -> Bucket:
    """`gs://BUCKET[/PATH]` or `file:///FOLDER`; a one-line UserError naming the setting otherwise."""
    text = text.strip()
    if text.startswith("gs://"):
        name, _, path = text[len("gs://"):].partition("/")
        if name and "/" not in name:
            return Bucket("gcs", name, (path.strip("/") or DEFAULT_PATH) + "/runs/")
    elif text.startswith("file://") and text[len("file://"):].startswith("/"):
        return Bucket("folder", text[len("file://"):], "runs/")
    raise UserError(f"[gcp] bucket = {text!r} is neither gs://BUCKET[/PATH] nor file:///FOLDER; fix it in "
                    "config.toml (or TPU_CONSOLE_GCP__BUCKET)")


def configured(settings: Settings) -> Bucket | None:
    """The bucket of the setting (None when unset)."""
    return parse_bucket(settings.gcp.bucket) if settings.gcp.bucket else None


def home_folder() -> Bucket:
    """Local pods' stand-in for the bucket, in this console's home."""
    return Bucket("folder", str(locations.home() / LOCAL_FOLDER), "runs/")


def places(settings: Settings) -> list[Bucket]:
    """Where `runs` looks for records: the configured bucket, and this home's folder for local pods."""
    bucket = configured(settings)
    return [bucket] if bucket == home_folder() else [b for b in (bucket, home_folder()) if b is not None]


def emulator_endpoint() -> str | None:
    host = os.environ.get(EMULATOR_ENV, "").strip()
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def supervisor_target(settings: Settings, provider: str) -> dict[str, Any] | None:
    """supervision.json's `record`: where the supervisor writes the run's record (None: nowhere). A bucket
    from a TPU VM with the VM's own credentials (its service account needs write access), from any pod
    through an emulator (no credentials); a local pod, which has no metadata server to ask, a folder: the
    `file://` setting or this home's. A folder on any other pod would be on the pod: nowhere."""
    bucket = configured(settings)
    emulator = emulator_endpoint()
    if provider == "local" and (bucket is None or (bucket.kind == "gcs" and emulator is None)):
        bucket = home_folder()
    if bucket is None or (bucket.kind == "folder" and provider != "local"):
        return None
    if bucket.kind == "folder":
        return {"kind": "folder", "path": bucket.name, "prefix": bucket.prefix, **_tails()}
    if emulator is None and provider != "gcp":
        return None
    return {"kind": "gcs", "bucket": bucket.name, "prefix": bucket.prefix, **_tails(),
            "endpoint": emulator or GCS_ENDPOINT, "auth": "none" if emulator else "metadata"}


def _tails() -> dict[str, int]:
    """How many lines of each worker's output the record keeps, and the shortest `.env` value masked in
    them (secrets.py's, so the bucket masks what the console's screens mask)."""
    return {"tail_lines": TAIL_LINES, "mask_min_length": MIN_SECRET_LENGTH}


# ---- reading -------------------------------------------------------------------------------------------


def read_records(bucket: Bucket, skip: set[str] = frozenset()) -> list[dict[str, Any]]:
    """Every run record in the bucket but those of `skip` (run ids already known to have ended). Raises
    whatever reaching the bucket raised; `merge_into_history` turns that into a warning."""
    if bucket.kind == "folder":
        folder = Path(bucket.name) / bucket.prefix
        paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
        return [data for path in paths if path.stem not in skip
                for data in [_json(path.read_bytes())] if data is not None]
    from google.cloud import storage  # imported here: only `runs` with a bucket needs it

    if emulator_endpoint():  # the emulator takes no credentials
        from google.auth.credentials import AnonymousCredentials

        client = storage.Client(project="tpu-console", credentials=AnonymousCredentials())
    else:
        client = storage.Client()
    records = []
    # retry=None: an unreachable bucket is said at once, not after minutes of retries
    for blob in client.list_blobs(bucket.name, prefix=bucket.prefix, timeout=READ_TIMEOUT_S, retry=None):
        run_id = blob.name[len(bucket.prefix):].removesuffix(".json")
        if run_id in skip or not blob.name.endswith(".json"):
            continue
        data = _json(blob.download_as_bytes(timeout=READ_TIMEOUT_S, retry=None))
        if data is not None:
            records.append(data)
    return records


def merge_into_history(settings: Settings, store: RunStore) -> str | None:
    """Bring the bucket's (and this home's folder's) records into the history; a warning (one line) when
    the bucket cannot be read or its setting is wrong, else None."""
    try:
        found = places(settings)
    except UserError as exc:
        return f"{exc}; runs are listed from this machine's history only"
    ended = {r.run_id for r in store.list(None, 100_000) if r.finished}
    warnings = []
    for bucket in found:
        try:
            records = read_records(bucket, ended)
        except Exception as exc:  # noqa: BLE001 - any failure to reach it is the same warning
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            warnings.append(f"the run records in {bucket.place} cannot be read ({type(exc).__name__}: "
                            f"{detail[:160]}); runs are listed from this machine's history only")
            continue
        for data in records:
            try:
                merge(store, data)
            except RecordError as exc:  # a run launched by a newer console: said, and the others merged
                warnings.append(f"{bucket.place}: {exc}")
    return "; ".join(warnings) or None


def merge(store: RunStore, data: dict[str, Any]) -> bool:
    """One record into the history: added when unknown; ended when the history still had it running and
    the node is gone (while the node is there, the console's own look at the run ends it, archiving its
    logs). False for a record that is not one, or that adds nothing; RecordError for one whose launch
    record this console is too old to read."""
    run_id = data.get("run_id")
    if not isinstance(run_id, str) or not is_run_id(run_id) or not data.get("outcome"):
        return False
    try:
        known = store.get(run_id)
    except NotFound:
        known = None
    if known is not None and (known.finished or not node_deleted(data)):
        return False
    state, failure = outcome(data)
    workers = _worker_records(data)
    if known is None:
        store.add(_run_record(data, state, failure, workers))
    else:
        store.update(run_id, state, list(workers.values()), failure=failure, finished=True)
    summary = _summary(data)
    if summary is not None:
        store.set_summary(run_id, summary)
    return True


def node_deleted(data: dict[str, Any]) -> bool:
    """Whether the supervisor went on to delete the node (its last word on it was deleting or deleted)."""
    return _last_node_decision(data) in ("deleting", "deleted")


def _last_node_decision(data: dict[str, Any]) -> str | None:
    said = [d.get("decision") for d in data.get("decisions") or [] if isinstance(d, dict)]
    return next((d for d in reversed(said) if d in ("deleting", "deleted", "delete-failed", "kept")), None)


def outcome(data: dict[str, Any]) -> tuple[str, str | None]:
    """The run's state and the note that says why it ended so, with the supervisor's reason."""
    state = str(data.get("outcome"))
    decisions = [d for d in data.get("decisions") or [] if isinstance(d, dict)]
    reason = data.get("reason")
    notes = []
    if reason in ("max-cost", "max-hang"):
        said = next((d.get("message") for d in decisions if d.get("decision") == reason), None)
        notes.append(f"stopped by its supervisor ({reason})" + (f": {said}" if said else ""))
    elif state == "failed":
        failed = [(int(w), v) for w, v in (data.get("workers") or {}).items()
                  if isinstance(v, dict) and v.get("exit_status") and not v.get("stopped")]
        if failed:
            worker, info = min(failed)
            notes.append(f"worker {worker} exited {info['exit_status']}"
                         + (f" ({info['cause']})" if info.get("cause") else ""))
    last = next((d for d in reversed(decisions)
                 if d.get("decision") in ("deleting", "deleted", "delete-failed", "kept")), None)
    if last is not None and last.get("decision") in ("deleting", "deleted"):
        notes.append(f"node deleted by the supervisor ({reason})" if reason not in ("max-cost", "max-hang")
                     else "node deleted")
    elif last is not None:
        notes.append(str(last.get("message", "")))
    return state, "; ".join(notes) or None


def _run_record(data: dict[str, Any], state: str, failure: str | None,
                workers: dict[int, WorkerRecord]) -> RunRecord:
    # format 1 said the node and provider beside the record too, and a record without launch.json had none
    launch = LaunchRecord.from_json(data.get("launch") or {}, data["run_id"], str(data.get("node") or "?"))
    if launch.provider == "?" and data.get("provider"):
        launch = replace(launch, provider=str(data["provider"]))
    return RunRecord.from_launch(
        launch,
        workers=sorted(workers) or list(launch.workers),
        started_at=launch.started() or _at(data.get("written_at")),
        state=state,
        failure=failure,
        finished_at=_ended_at(data),
        worker_records=workers,
    )


def _worker_records(data: dict[str, Any]) -> dict[int, WorkerRecord]:
    workers = {}
    for key, info in (data.get("workers") or {}).items():
        if not isinstance(info, dict) or not str(key).isdigit():
            continue
        lost = info.get("state") == "lost"
        workers[int(key)] = WorkerRecord(int(key), "lost" if lost else "exited",
                                         exit_status=None if lost else info.get("exit_status"))
    return workers


def _summary(data: dict[str, Any]) -> dict[str, Any] | None:
    last_steps = {}
    for key, info in (data.get("workers") or {}).items():
        event = info.get("last_event") if isinstance(info, dict) else None
        parsed = parse_event_line(json.dumps(event)) if isinstance(event, dict) else None
        last_steps[key] = StepMetrics.from_event(parsed) if parsed is not None else None
    if not any(last_steps.values()):
        return None
    return summarize(last_steps)


def _ended_at(data: dict[str, Any]) -> datetime:
    ended = next((d.get("t") for d in data.get("decisions") or []
                  if isinstance(d, dict) and d.get("decision") == "ended"), None)
    return _at(ended if ended is not None else data.get("written_at"))


def _at(t: Any) -> datetime:
    return datetime.fromtimestamp(float(t), UTC) if isinstance(t, int | float) else datetime.now(UTC)


def _json(data: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
