"""`controller start --gce`: the controller on a small Compute Engine VM the console makes, starts, and
deletes when asked (`controller delete-vm`, `controller stop --gce --delete`).

The VM (`tpu-console-controller` in `--zone`, else the first of `[gcp] zones`; `e2-small` unless
`--machine-type`) is Debian 12, on the project's default network with an external address, the project's
default service account with the cloud-platform scope (its Google credentials: the controller there reads
the bucket and drives the TPU API with them), not preemptible, labelled `tpu-console=controller`, and given
this console's public key for the user `tpu-console` in its `ssh-keys` metadata. Once it runs, its SSH is
`controller start --on` (remote.py): the console installed there, the controller started. Its host key is
trusted on first use and kept per VM (a new VM of the same name is a new host).

google-cloud-compute with the REST transport; `[gcp] compute_api_endpoint` points it elsewhere (an
emulator on 127.0.0.1 is spoken to anonymously). Its long-running operations are waited for here, with a
zone operations client on the same endpoint: the library's own `.result()` polls through a client it makes
without the endpoint, which always asks compute.googleapis.com.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tpu_console import locations, ssh_identity
from tpu_console.controller import remote
from tpu_console.errors import UserError
from tpu_console.fleet.preflight import unreachable_workers
from tpu_console.history import bucket_record
from tpu_console.providers.base import Progress, no_progress
from tpu_console.providers.gcp.client import CLOUD_PLATFORM_SCOPE, load_credentials, require_project
from tpu_console.settings import Settings, SshNodeSettings

VM_NAME = "tpu-console-controller"
MACHINE_TYPE = "e2-small"
IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DISK_GB = 10
VM_USER = "tpu-console"  # made by the guest agent from ssh-keys, with passwordless sudo
SSH_PORT = 22
SSH_WAIT_S = 240.0  # a new VM's sshd answers about a minute after RUNNING
OPERATION_TIMEOUT_S = 300.0
POLL_S = 2.0


class ComputeApi:
    """The few Compute Engine calls the controller's VM needs, synchronous (run them in a thread)."""

    def __init__(self, settings: Settings) -> None:
        from google.cloud import compute_v1

        self.project = require_project(settings.gcp)
        endpoint = settings.gcp.compute_api_endpoint
        options = {"api_endpoint": endpoint} if endpoint else None
        credentials = load_credentials(endpoint)
        self.instances = compute_v1.InstancesClient(credentials=credentials, transport="rest",
                                                    client_options=options)
        self.operations = compute_v1.ZoneOperationsClient(credentials=credentials, transport="rest",
                                                          client_options=options)

    def get(self, zone: str, name: str) -> Any | None:
        from google.api_core.exceptions import NotFound

        try:
            return self._call("get", self.instances.get, project=self.project, zone=zone, instance=name)
        except NotFound:
            return None

    def insert(self, zone: str, instance: Any) -> None:
        self._wait(zone, self._call("insert", self.instances.insert_unary, project=self.project, zone=zone,
                                    instance_resource=instance))

    def start(self, zone: str, name: str) -> None:
        self._wait(zone, self._call("start", self.instances.start_unary, project=self.project, zone=zone,
                                    instance=name))

    def delete(self, zone: str, name: str) -> None:
        self._wait(zone, self._call("delete", self.instances.delete_unary, project=self.project, zone=zone,
                                    instance=name))

    @staticmethod
    def _call(what: str, method: Any, **request: Any) -> Any:
        """The call; an API error as a one-line UserError (NotFound passed on: absent is an answer)."""
        from google.api_core.exceptions import GoogleAPICallError, NotFound

        try:
            return method(**request)
        except NotFound:
            raise
        except GoogleAPICallError as exc:
            said = exc.message
        raise UserError(f"Compute Engine refused the {what} of the controller's VM: {said}")

    def _wait(self, zone: str, operation: Any) -> None:
        from google.cloud import compute_v1

        deadline = time.monotonic() + OPERATION_TIMEOUT_S
        while operation.status != compute_v1.Operation.Status.DONE:
            if time.monotonic() > deadline:
                raise UserError(f"Compute Engine's {operation.operation_type} of {operation.target_link} did "
                                f"not finish within {OPERATION_TIMEOUT_S:.0f} s; look at it in the console")
            time.sleep(POLL_S)
            operation = self._call("wait", self.operations.get, project=self.project, zone=zone,
                                   operation=operation.name)
        if operation.error and operation.error.errors:
            said = "; ".join(e.message for e in operation.error.errors)
            raise UserError(f"Compute Engine's {operation.operation_type} failed: {said}")

    def close(self) -> None:
        self.instances.transport.close()
        self.operations.transport.close()


def vm_resource(name: str, zone: str, machine_type: str) -> Any:
    """The VM as Compute Engine takes it."""
    from google.cloud import compute_v1

    boot_disk = compute_v1.AttachedDiskInitializeParams(source_image=IMAGE, disk_size_gb=DISK_GB)
    return compute_v1.Instance(
        name=name, machine_type=f"zones/{zone}/machineTypes/{machine_type}",
        labels={"tpu-console": "controller"},
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=boot_disk)],
        network_interfaces=[compute_v1.NetworkInterface(network="global/networks/default", access_configs=[
            compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")])],
        service_accounts=[compute_v1.ServiceAccount(email="default", scopes=[CLOUD_PLATFORM_SCOPE])],
        metadata=compute_v1.Metadata(items=[
            compute_v1.Items(key="ssh-keys", value=f"{VM_USER}:{ssh_identity.public_key_line()}"),
            compute_v1.Items(key="enable-oslogin", value="FALSE")]),
    )


def zone_of(settings: Settings, zone: str | None) -> str:
    if zone:
        return zone
    if settings.gcp.zones:
        return settings.gcp.zones[0]
    raise UserError("no zone for the controller's VM: pass --zone ZONE or set [gcp] zones in config.toml")


def host_of(instance: Any, zone: str) -> remote.RemoteHost:
    """How to reach the running VM: its external address, this console's key, its own host key file."""
    configs = instance.network_interfaces[0].access_configs if instance.network_interfaces else []
    address = next((c.nat_i_p for c in configs if c.nat_i_p), None)
    if not address:
        raise UserError(f"the VM {instance.name} has no external address; give it one (an access config) "
                        "or delete it with `tpu-console controller delete-vm`")
    known_hosts = locations.home() / "controller" / "gce" / f"{instance.id}.known_hosts"
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    return remote.RemoteHost(f"gce:{zone}/{instance.name}", SshNodeSettings(
        name=instance.name, hosts=[f"{address}:{SSH_PORT}"], user=VM_USER,
        key=str(ssh_identity.client_key_path()), known_hosts=str(known_hosts), accept_new=True))


async def _running(api: ComputeApi, zone: str, name: str, machine_type: str, progress: Progress) -> Any:
    """The VM, made or started as needed, RUNNING."""
    instance = await asyncio.to_thread(api.get, zone, name)
    if instance is None:
        progress(f"creating the VM {name} ({machine_type}) in {zone}")
        await asyncio.to_thread(api.insert, zone, vm_resource(name, zone, machine_type))
    elif instance.status in ("TERMINATED", "STOPPED", "SUSPENDED"):
        progress(f"starting the VM {name} in {zone} ({instance.status.lower()})")
        await asyncio.to_thread(api.start, zone, name)
    deadline = time.monotonic() + OPERATION_TIMEOUT_S
    while True:
        instance = await asyncio.to_thread(api.get, zone, name)
        if instance is not None and instance.status == "RUNNING":
            return instance
        if time.monotonic() > deadline:
            state = instance.status if instance else "gone"
            raise UserError(f"the VM {name} is {state}, not RUNNING, after {OPERATION_TIMEOUT_S:.0f} s; look "
                            "at it, or delete it with `tpu-console controller delete-vm`")
        await asyncio.sleep(POLL_S)


async def _wait_for_ssh(host: remote.RemoteHost, progress: Progress) -> None:
    deadline = time.monotonic() + SSH_WAIT_S
    progress(f"{host.label}: waiting for its SSH at {host.address}")
    while True:
        async with await remote.fleet_of(host) as fleet:
            failed = await unreachable_workers(fleet, [0])
        if not failed:
            return
        if time.monotonic() > deadline:
            raise UserError(f"{host.label}: SSH at {host.address} did not answer within {SSH_WAIT_S:.0f} s "
                            f"({failed[0]}); the VM is left running: `controller start --gce` again, or "
                            "`controller delete-vm`")
        await asyncio.sleep(POLL_S * 2)


async def start_gce(settings: Settings, *, zone: str | None = None, machine_type: str = MACHINE_TYPE,
                    detached: bool = False, progress: Progress = no_progress) -> dict[str, Any]:
    """Make (or start) the VM and start the controller on it; `controller start --on`'s answer, with the
    VM's name and zone."""
    bucket = bucket_record.configured(settings)
    if bucket is None or bucket.kind != "gcs":
        raise UserError("the controller's state must be in a Cloud Storage bucket the VM can read; set "
                        "`[gcp] bucket = \"gs://BUCKET\"` in config.toml")
    zone = zone_of(settings, zone)
    api = ComputeApi(settings)
    try:
        instance = await _running(api, zone, VM_NAME, machine_type, progress)
    finally:
        await asyncio.to_thread(api.close)
    host = host_of(instance, zone)
    await _wait_for_ssh(host, progress)
    started = await remote.start_on(settings, host, detached=detached, progress=progress)
    return {**started, "vm": VM_NAME, "zone": zone}


async def on_vm(settings: Settings, zone: str | None, verb: list[str]) -> str:
    """`controller VERB` on the running VM; UserError when there is none."""
    zone = zone_of(settings, zone)
    api = ComputeApi(settings)
    try:
        instance = await asyncio.to_thread(api.get, zone, VM_NAME)
    finally:
        await asyncio.to_thread(api.close)
    if instance is None or instance.status != "RUNNING":
        state = "no" if instance is None else f"its {instance.status.lower()}"
        raise UserError(f"{state} VM {VM_NAME} in {zone} runs the controller; start it with "
                        "`tpu-console controller start --gce`")
    return await remote.run_there(host_of(instance, zone), verb)


async def delete_vm(settings: Settings, zone: str | None = None, progress: Progress = no_progress) -> bool:
    """Delete the VM (its disk with it); whether there was one."""
    zone = zone_of(settings, zone)
    api = ComputeApi(settings)
    try:
        if await asyncio.to_thread(api.get, zone, VM_NAME) is None:
            return False
        progress(f"deleting the VM {VM_NAME} in {zone}")
        await asyncio.to_thread(api.delete, zone, VM_NAME)
        return True
    finally:
        await asyncio.to_thread(api.close)
