"""Objects with compare-and-swap: the controller's state in the bucket (`[gcp] bucket`), or in the folder
standing for it on local pods (the same place the run records go: history/bucket_record.py).

Every object carries a generation, as Cloud Storage's do: `read` returns (data, generation) and `write`
takes the generation the caller read (0: the object must not exist yet) and fails with `Conflict` when the
object has changed since. That one primitive is the lease (lease.py) and the fence on every state change
(loop.py): a controller that lost the lease cannot overwrite what the one holding it wrote.

In the bucket: objects `<path>/controller/<name>.json`, written with `ifGenerationMatch` (google-cloud-
storage); in a folder: `<folder>/controller/<name>.json` holding `{"generation": N, "data": ...}`, replaced
atomically under `flock` on a lock file beside it, so two processes on this machine cannot both win.

Beside them, files written once and never changed, named by their content's digest (a managed run's project
snapshot, controller/snapshot.py): `put_file` keeps an object already there, `get_file` reads one back.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from tpu_console.history import bucket_record
from tpu_console.history.bucket_record import Bucket
from tpu_console.settings import Settings

FOLDER = "controller"
TIMEOUT_S = 10.0
FILE_TIMEOUT_S = 300.0  # a project snapshot may be tens of MB


class Conflict(Exception):
    """The object changed since it was read (or exists, where it must not): someone else wrote it."""


class StateStore(Protocol):
    place: str  # where, for messages: gs://BUCKET/PATH/controller/ or a folder

    def read(self, name: str) -> tuple[dict[str, Any] | None, int]:
        """The object's data and generation; (None, 0) when there is none."""

    def write(self, name: str, data: dict[str, Any], generation: int) -> int:
        """Replace the object if its generation is still `generation` (0: create it); the new generation.
        Raises Conflict otherwise."""

    def names(self) -> list[str]:
        """The objects there, by name."""

    def delete(self, name: str, generation: int) -> None:
        """Remove the object if its generation is still `generation`; Conflict otherwise."""

    def put_file(self, name: str, data: bytes) -> None:
        """Write the file `name` (a path such as `projects/<digest>.tar.gz`) unless it is there already."""

    def get_file(self, name: str) -> bytes | None:
        """The file's content; None when there is none."""


class FolderStore:
    """The folder standing for the bucket: one JSON file per object, generations kept inside it."""

    def __init__(self, folder: str | Path) -> None:
        self.root = Path(folder)
        self.place = str(self.root)

    def _path(self, name: str) -> Path:
        return self.root / f"{name}.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def _read(self, name: str) -> tuple[dict[str, Any] | None, int]:
        try:
            stored = json.loads(self._path(name).read_text())
        except FileNotFoundError:
            return None, 0
        return stored["data"], int(stored["generation"])

    def read(self, name: str) -> tuple[dict[str, Any] | None, int]:
        with self._locked():
            return self._read(name)

    def write(self, name: str, data: dict[str, Any], generation: int) -> int:
        with self._locked():
            current, found = self._read(name)
            if found != generation:
                raise Conflict(f"{name} is at generation {found}, not {generation}")
            path = self._path(name)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"generation": found + 1, "data": data}, indent=1) + "\n")
            tmp.replace(path)
            return found + 1

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.stem for p in self.root.glob("*.json"))

    def delete(self, name: str, generation: int) -> None:
        with self._locked():
            _, found = self._read(name)
            if found != generation:
                raise Conflict(f"{name} is at generation {found}, not {generation}")
            self._path(name).unlink(missing_ok=True)

    def put_file(self, name: str, data: bytes) -> None:
        path = self.root / name
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_bytes(data)
        partial.replace(path)

    def get_file(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None


class GcsStore:
    """Objects in a Cloud Storage bucket, each write conditioned on the generation read
    (`ifGenerationMatch`; 0 means the object must not exist)."""

    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket_name, self.prefix = bucket, prefix
        self.place = f"gs://{bucket}/{prefix}"
        self._bucket: Any = None

    def _client_bucket(self) -> Any:
        if self._bucket is None:
            from google.cloud import storage  # imported here: only a bucket-backed controller needs it

            if bucket_record.emulator_endpoint():  # the emulator takes no credentials
                from google.auth.credentials import AnonymousCredentials

                client = storage.Client(project="tpu-console", credentials=AnonymousCredentials())
            else:
                client = storage.Client()
            self._bucket = client.bucket(self.bucket_name)
        return self._bucket

    def read(self, name: str) -> tuple[dict[str, Any] | None, int]:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        bucket = self._client_bucket()
        for _ in range(5):  # the object may change between its metadata and its content: read again
            blob = bucket.get_blob(self.prefix + name + ".json", timeout=TIMEOUT_S, retry=None)
            if blob is None:
                return None, 0
            try:
                content = blob.download_as_bytes(if_generation_match=blob.generation, timeout=TIMEOUT_S,
                                                 retry=None)
            except (NotFound, PreconditionFailed):
                continue
            return json.loads(content), int(blob.generation)
        raise Conflict(f"{name} kept changing while it was read")

    def write(self, name: str, data: dict[str, Any], generation: int) -> int:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._client_bucket().blob(self.prefix + name + ".json")
        try:
            # retry=None: a timed-out write is reported, never replayed blindly over a newer generation
            blob.upload_from_string(json.dumps(data, indent=1) + "\n", content_type="application/json",
                                    if_generation_match=generation, timeout=TIMEOUT_S, retry=None)
        except PreconditionFailed as exc:
            raise Conflict(f"{name} changed since generation {generation}") from exc
        return int(blob.generation)

    def names(self) -> list[str]:
        blobs = self._client_bucket().list_blobs(prefix=self.prefix, timeout=TIMEOUT_S, retry=None)
        return sorted(b.name[len(self.prefix):].removesuffix(".json") for b in blobs
                      if b.name.endswith(".json") and "/" not in b.name[len(self.prefix):])

    def delete(self, name: str, generation: int) -> None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self._client_bucket().blob(self.prefix + name + ".json")
        try:
            blob.delete(if_generation_match=generation, timeout=TIMEOUT_S, retry=None)
        except PreconditionFailed as exc:
            raise Conflict(f"{name} changed since generation {generation}") from exc
        except NotFound:
            if generation:
                raise Conflict(f"{name} is gone") from None

    def put_file(self, name: str, data: bytes) -> None:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._client_bucket().blob(self.prefix + name)
        with contextlib.suppress(PreconditionFailed):  # there already: the same content, by its name
            blob.upload_from_string(data, content_type="application/octet-stream", if_generation_match=0,
                                    timeout=FILE_TIMEOUT_S)

    def get_file(self, name: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._client_bucket().blob(self.prefix + name).download_as_bytes(timeout=FILE_TIMEOUT_S)
        except NotFound:
            return None


def open_store(settings: Settings) -> StateStore:
    """The controller's store: beside the run records in the configured bucket, else in the folder standing
    for it in this console's home (local pods)."""
    return store_at(bucket_record.configured(settings) or bucket_record.home_folder())


def store_at(bucket: Bucket) -> StateStore:
    """`<path>/controller/` beside the bucket's `<path>/runs/`."""
    prefix = bucket.prefix.removesuffix("runs/") + FOLDER + "/"
    if bucket.kind == "gcs":
        return GcsStore(bucket.name, prefix)
    return FolderStore(Path(bucket.name) / prefix)
