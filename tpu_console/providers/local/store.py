"""The local provider's pods on disk. A node is a folder; each worker is a sub-folder that acts as its disk.

<local_pods_dir>/<name>/node.json            type, shape, slices, created_at, state, labels
A multislice pod (`slices` > 1) is one node whose workers are numbered slice by slice: `workers` counts
them all, worker w is in slice w // (workers / slices). Once one of its slices was lost (a rehearsed
preemption of that slice alone), node.json keeps each slice's state (`slice_states`) and `state` is the
worst of them, as on a Cloud TPU multislice.
<local_pods_dir>/<name>/host_keys/worker-<i>  the worker's SSH host key (made once, pinned by the client)
<local_pods_dir>/<name>/workers/<i>/          the worker's HOME
<local_pods_dir>/.trash/<name>-<ns>/         a deleted pod's folder, moved aside at once and removed by a
                                             process of its own (a project's environments make a pod
                                             gigabytes of small files: minutes of `rm` on a slow disk)
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import asyncssh

from tpu_console.domain import AcceleratorShape, Node, NodeState, Worker
from tpu_console.errors import AlreadyExists, NotFound
from tpu_console.providers.local.shapes import parse_local_type

LOOPBACK = "127.0.0.1"
TRASH_DIR = ".trash"  # deleted pods' folders on their way out (no node name starts with a dot)


class PodStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def node_dir(self, name: str) -> Path:
        return self.root / name

    def worker_dir(self, name: str, worker: int) -> Path:
        return self.node_dir(name) / "workers" / str(worker)

    def host_key_path(self, name: str, worker: int) -> Path:
        return self.node_dir(name) / "host_keys" / f"worker-{worker}"

    def names(self) -> list[str]:
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / "node.json").exists())

    def read(self, name: str) -> Node:
        meta_file = self.node_dir(name) / "node.json"
        try:
            meta = json.loads(meta_file.read_text())
        except FileNotFoundError:
            known = ", ".join(self.names()) or "none"
            raise NotFound(
                f"no local node named {name!r} (local nodes: {known}); create it with `create {name} "
                "--type local-2x4`"
            ) from None
        shape = AcceleratorShape(
            accelerator_type=meta["accelerator_type"],
            workers=meta["workers"],
            devices_per_worker=meta["devices_per_worker"],
            chips=meta["workers"] * meta["devices_per_worker"],
        )
        return Node(
            name=name,
            provider="local",
            shape=shape,
            state=NodeState(meta["state"]),
            workers=tuple(Worker(index=i, host=LOOPBACK, port=0) for i in range(shape.workers)),
            zone="local",
            runtime_version="local",
            created_at=datetime.fromisoformat(meta["created_at"]),
            slices=meta.get("slices", 1),
            labels=dict(meta.get("labels") or {}),
            slice_states=tuple(meta.get("slice_states") or ()),
        )

    def create(self, name: str, accelerator_type: str, slices: int = 1,
               labels: dict[str, str] | None = None) -> Node:
        one_slice = parse_local_type(accelerator_type)
        shape = replace(one_slice, workers=one_slice.workers * slices, chips=one_slice.chips * slices)
        node_dir = self.node_dir(name)
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            node_dir.mkdir()  # atomic: two consoles creating the same name cannot both win
        except FileExistsError:
            raise AlreadyExists(
                f"a local node named {name!r} already exists; pick another name or delete it first"
            ) from None
        meta = {
            "name": name,
            "accelerator_type": shape.accelerator_type,
            "workers": shape.workers,
            "devices_per_worker": shape.devices_per_worker,
            "slices": slices,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "state": NodeState.CREATING.value,
            "labels": dict(labels or {}),  # as a cloud node's: who made it (a managed run's controller)
        }
        self._write_meta(name, meta)
        (node_dir / "host_keys").mkdir(mode=0o700)
        for worker in range(shape.workers):
            self.worker_dir(name, worker).mkdir(parents=True)
            self._write_host_key(self.host_key_path(name, worker))
        meta["state"] = NodeState.READY.value
        self._write_meta(name, meta)
        return self.read(name)

    def host_public_key(self, name: str, worker: int) -> str:
        """The worker's host key in OpenSSH one-line format: what the client pins."""
        return self.host_key_path(name, worker).with_suffix(".pub").read_text().strip()

    def host_private_key(self, name: str, worker: int) -> asyncssh.SSHKey:
        return asyncssh.read_private_key(self.host_key_path(name, worker))

    def set_state(self, name: str, state: NodeState) -> None:
        meta = json.loads((self.node_dir(name) / "node.json").read_text())
        meta["state"] = state.value
        self._write_meta(name, meta)

    def set_slice_state(self, name: str, index: int, state: NodeState) -> None:
        """One slice's state; the node's is then the worst of its slices' (the first not READY)."""
        meta = json.loads((self.node_dir(name) / "node.json").read_text())
        states = list(meta.get("slice_states") or [meta["state"]] * meta.get("slices", 1))
        states[index] = state.value
        meta["slice_states"] = states
        meta["state"] = next((s for s in states if s != NodeState.READY.value), NodeState.READY.value)
        self._write_meta(name, meta)

    def remove(self, name: str) -> Path:
        """Move the pod's folder aside (its name is free at once) and start its removal in the background,
        with whatever an earlier removal left (the machine went down half-way); where it went."""
        trash = self.root / TRASH_DIR
        trash.mkdir(exist_ok=True)
        aside = trash / f"{name}-{time.time_ns()}"
        self.node_dir(name).rename(aside)
        removal = subprocess.Popen(  # noqa: S603 - a fixed argv; detached, so it outlives a CLI command
            ["rm", "-rf", "--", *sorted(str(p) for p in trash.iterdir())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        # reaped when it ends, so a long-lived console (the app) leaves no zombie per delete
        threading.Thread(target=removal.wait, daemon=True).start()
        return aside

    def _write_meta(self, name: str, meta: dict) -> None:
        path = self.node_dir(name) / "node.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        tmp.replace(path)

    @staticmethod
    def _write_host_key(path: Path) -> None:
        key = asyncssh.generate_private_key("ssh-ed25519", comment=f"tpu-console-local-{path.name}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key.export_private_key())
        path.with_suffix(".pub").write_bytes(key.export_public_key())
