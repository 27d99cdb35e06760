"""SSH access to a TPU node without gcloud: the console's key into the node's `ssh-keys` metadata (or
OS Login), and each worker's host key from the node's guest attributes, pinned on first sight.

Why pin: guest attributes are what the VM's guest agent published, read over an authenticated API, so
they are a trustworthy first sight of the keys. After that a different key for the same node (same
node id) means something is wrong, and the console refuses instead of trusting it. A node deleted and
created again under the same name has a new id, so its new keys are pinned afresh.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
from pathlib import Path

from tpu_console import locations
from tpu_console.errors import UserError
from tpu_console.providers.gcp.errors import API_ERRORS, FailureKind, classify_exception

SSH_KEYS = "ssh-keys"
OS_LOGIN = "enable-oslogin"
HOST_KEYS_QUERY = "hostkeys/"


# ---- ssh-keys metadata ------------------------------------------------------------------------------

def merge_ssh_key(existing: str, user: str, public_key_line: str) -> str | None:
    """The `ssh-keys` value with `user:<key>` appended, or None when that user already has that key.

    Other users' lines are kept byte for byte: the value is shared by everyone who uses the node.
    """
    kind, blob = public_key_line.split()[:2]
    for line in existing.splitlines():
        owner, _, key = line.strip().partition(":")
        if owner == user and key.split()[:2] == [kind, blob]:
            return None
    entry = f"{user}:{public_key_line.strip()}"
    if not existing.strip():
        return entry
    return existing.rstrip("\n") + "\n" + entry


def oslogin_enabled(metadata: dict[str, str]) -> bool:
    """OS Login as the node's metadata sets it. (A project-wide setting is not visible through the TPU
    API; set `[gcp] oslogin_user` in that case, which forces OS Login.)"""
    return metadata.get(OS_LOGIN, "").strip().lower() in ("true", "1", "yes")


async def ensure_metadata_key(api, path: str, user: str, public_key_line: str, *, attempts: int = 6,
                              operation_timeout: float = 300.0, retry_delay: float = 1.0) -> bool:
    """Make sure `user:<key>` is in the node's `ssh-keys`; True when it had to be added.

    The TPU API has no etag on nodes, so a concurrent change shows up as 409 ABORTED (another operation
    on the node) and is retried from a fresh read; the final read confirms the key is really there.
    """
    added = False
    for attempt in range(attempts + 1):
        node = await api.get_node(path)
        metadata = dict(node.metadata)
        merged = merge_ssh_key(metadata.get(SSH_KEYS, ""), user, public_key_line)
        if merged is None:
            return added
        if attempt == attempts:
            break
        metadata[SSH_KEYS] = merged
        try:
            operation_name = await api.update_metadata(path, metadata)
            operation = await api.wait_operation(operation_name, operation_timeout)
        except API_ERRORS as exc:
            failure = classify_exception(exc)
            if failure.kind not in (FailureKind.CONFLICT, FailureKind.TRANSIENT):
                raise UserError(f"could not add the console's SSH key to {path}: {failure.describe()}"
                                + (f"; {failure.fix()}" if failure.fix() else "")) from None
            await asyncio.sleep(retry_delay * (attempt + 1))
            continue
        if operation.error.code:
            if operation.error.code != 10:  # ABORTED: retry like a 409
                raise UserError(f"could not add the console's SSH key to {path}: {operation.error.message}")
            await asyncio.sleep(retry_delay * (attempt + 1))
            continue
        added = True  # the next read confirms it, or finds it lost to a concurrent write and retries
    raise UserError(f"could not add the console's SSH key to {path}: the node kept changing under us "
                    f"({attempts} tries); retry in a minute")


async def import_oslogin_key(credentials, endpoint: str, account: str, public_key_line: str) -> str:
    """Register the key with OS Login for `account` (an email); returns the POSIX username to log in as."""
    from google.auth.transport.requests import AuthorizedSession

    def post() -> dict:
        session = AuthorizedSession(credentials)
        try:
            response = session.post(f"{endpoint}/v1/users/{account}:importSshPublicKey",
                                    json={"key": public_key_line}, timeout=60)
        finally:
            session.close()
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:200]
            raise UserError(f"OS Login refused the console's key for {account}: {message}; check "
                            "[gcp] oslogin_user and that you have roles/compute.osAdminLogin")
        return response.json()

    profile = (await asyncio.to_thread(post)).get("loginProfile", {})
    accounts = profile.get("posixAccounts", [])
    primary = next((a for a in accounts if a.get("primary")), accounts[0] if accounts else None)
    if not primary or not primary.get("username"):
        raise UserError(
            f"OS Login returned no POSIX account for {account}; log in once with gcloud to create it"
        )
    return primary["username"]


# ---- host keys --------------------------------------------------------------------------------------


def host_keys_from_guest_attributes(attributes: list) -> list[list[str]]:
    """One list per worker (in worker order) of `type base64` lines from the `hostkeys/` namespace."""
    workers = []
    for worker in attributes:
        lines = []
        for item in worker.query_value.items:
            if item.namespace == "hostkeys" and item.key and item.value:
                lines.append(f"{item.key} {item.value}")
        workers.append(sorted(lines))
    return workers


def fingerprint(line: str) -> str:
    """OpenSSH-style `SHA256:...` fingerprint of a `type base64` key line."""
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def pins_file() -> Path:
    path = locations.home() / "gcp"
    path.mkdir(parents=True, exist_ok=True)
    return path / "host_keys.json"


def check_and_pin(node_path: str, node_id: str, observed: list[list[str]]) -> list[tuple[str, ...]]:
    """Compare the keys each worker publishes now with those pinned for this node, pin new ones, and
    return the keys to trust per worker. Raises UserError if a pinned key changed."""
    file = pins_file()
    pins = _load_pins(file)
    entry = pins.get(node_path)
    if entry is None or entry.get("id") != node_id:
        entry = {"id": node_id, "workers": {}}  # a new node (or one recreated under the same name)
    trusted: list[tuple[str, ...]] = []
    for worker, lines in enumerate(observed):
        pinned = {line.split()[0]: line for line in entry["workers"].get(str(worker), [])}
        current = {line.split()[0]: line for line in lines}
        for kind, line in current.items():
            if kind in pinned and pinned[kind] != line:
                _refuse(node_path, worker, pinned[kind], line, file)
        if pinned and not set(pinned) & set(current):
            _refuse(node_path, worker, next(iter(pinned.values())), next(iter(current.values()), ""), file)
        merged = {**pinned, **current}
        entry["workers"][str(worker)] = sorted(merged.values())
        trusted.append(tuple(sorted(merged.values())))
    pins[node_path] = entry
    _save_pins(file, pins)
    return trusted


def _refuse(node_path: str, worker: int, pinned: str, seen: str, file: Path) -> None:
    seen_text = fingerprint(seen) if seen else "no key"
    raise UserError(
        f"host key of worker {worker} of {node_path} changed: pinned {fingerprint(pinned)}, now {seen_text}; "
        f"refusing to connect. If you know why (the VM was rebuilt), remove its entry from {file}"
    )


def _load_pins(file: Path) -> dict:
    if not file.exists():
        return {}
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError:
        raise UserError(
            f"{file} is not valid JSON; fix it or move it aside (it pins gcp host keys)"
        ) from None


def _save_pins(file: Path, pins: dict) -> None:
    tmp = file.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(pins, indent=1, sort_keys=True))
    tmp.replace(file)  # atomic, so a concurrent console never reads half a file
