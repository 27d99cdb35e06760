"""`controller start | stop | logs --on HOST`: the controller on another always-on machine, over SSH.

HOST is `user@host[:port]` (this console's own key, `~/.ssh/known_hosts`) or the name of an
`[[ssh.nodes]]` entry (its first host, user, key and known_hosts). Starting installs the console there the
way bootstrap and sync provision a worker, under `~/tpu-console/` of the host:

    env/                       a virtual environment with the console's dependencies (bootstrap's recipe;
                               linked to this machine's packages when the host is this machine)
    controller/code/<digest>/  this checkout as it is on disk (pyproject.toml, README.md, tpu_console/,
                               trainer/), installed into env in editable mode: the controller there builds
                               the same trainer wheel from it when it relaunches a run
    controller/home/           the controller's TPU_CONSOLE_HOME: config.toml (mode 0600) with the
                               settings it needs ([gcp], [notify], [ssh], [local], [workers]), its log

then runs `tpu-console controller start` there (a systemd user service where that host has a user manager,
else a detached process) and reports which. The controller's state is in the bucket, so any console sees
it; a store that is a folder of this machine (no `[gcp] bucket`) is refused unless the host is this
machine. Nothing secret travels on a command line: the config (the webhook URL is a secret) is uploaded
over SFTP, and so is the `.env` of every managed run not yet ended, from the path it was launched with,
into `controller/home/controller/env/<managed id>.env` (0600; env_copies.py). The host is remembered
(`$TPU_CONSOLE_HOME/controller/hosts.json`: how to reach it, by its label) so that a run handed over later
gives its `.env` to the controller there at once (handover.give_env).
"""

from __future__ import annotations

import asyncio
import getpass
import ipaddress
import json
import re
import shlex
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_console import locations, secrets, ssh_identity
from tpu_console.controller import daemon, env_copies
from tpu_console.controller.state import ManagedRun
from tpu_console.errors import UserError, one_line
from tpu_console.fleet.fleet import Fleet
from tpu_console.fleet.preflight import require_all_reachable, unreachable_workers
from tpu_console.history import bucket_record
from tpu_console.providers.base import Progress, no_progress
from tpu_console.providers.ssh import SshProvider, parse_host
from tpu_console.provision import worker_recipes
from tpu_console.provision.bootstrap import (
    BOOTSTRAP_TIMEOUT_S,
    checked_python_version,
    console_python_version,
    console_tools,
)
from tpu_console.provision.code_sync import find_checkout
from tpu_console.provision.project_sync import PackedProject, digest_of, file_states, project_files
from tpu_console.provision.requirements import environment_digest
from tpu_console.provision.steps import console_site_packages, run_on_workers
from tpu_console.settings import Settings, SshNodeSettings, SshSettings

ROOT = f"{worker_recipes.ROOT}/controller"  # relative to the host's home
HOME_DIR = f"{ROOT}/home"
CODE_DIR = f"{ROOT}/code"
# What the checkout's wheel is built from: enough to install it, and for the controller there to build it.
SHIPPED = ("pyproject.toml", "README.md", "LICENSE", ".gitignore", "tpu_console/", "trainer/")
# The settings the controller acts on; keys, the app's bindings and the like stay here.
COPIED_SETTINGS = ("default_provider", "gcp", "notify", "ssh", "local", "workers")

COMMAND_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RemoteHost:
    label: str  # as the person named it: an [[ssh.nodes]] name, or user@host:port
    ssh: SshNodeSettings  # one host: how to reach it

    @property
    def address(self) -> str:
        return f"{self.ssh.user}@{self.ssh.hosts[0]}"


def resolve_host(text: str, settings: Settings) -> RemoteHost:
    """An `[[ssh.nodes]]` name (its first host), or `user@host[:port]`; a one-line UserError otherwise."""
    text = text.strip()
    named = {node.name: node for node in settings.ssh.nodes}
    if text in named:
        node = named[text]
        return RemoteHost(text, node.model_copy(update={"hosts": node.hosts[:1]}))
    user, at, rest = text.rpartition("@")
    if (at and not user) or not rest or re.search(r"\s|/", text):
        raise UserError(f"--on {text!r} is neither user@host[:port] nor an [[ssh.nodes]] name "
                        f"(configured: {', '.join(named) or 'none'}); give one of them")
    host, port = parse_host(rest)
    user = user or getpass.getuser()
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return RemoteHost(f"{user}@{shown}", SshNodeSettings(
        name="controller-host", hosts=[shown], user=user, key=str(ssh_identity.client_key_path()),
        known_hosts=str(Path("~/.ssh/known_hosts").expanduser())))


def is_this_machine(host: RemoteHost) -> bool:
    """Whether the host is this machine (its loopback, or its own name): it sees this console's folders."""
    name = parse_host(host.ssh.hosts[0])[0]
    if name in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def refuse_unshared_store(settings: Settings, host: RemoteHost) -> None:
    """The controller's state must be where both machines see it: the bucket, not a folder here."""
    bucket = bucket_record.configured(settings)
    if (bucket is None or bucket.kind == "folder") and not is_this_machine(host):
        where = bucket.name if bucket else bucket_record.home_folder().name
        raise UserError(f"the controller's state is in a folder of this machine ({where}), which "
                        f"{host.label} cannot see; set `[gcp] bucket = \"gs://BUCKET\"` in config.toml so "
                        "both machines share it, then start it there again")


def console_requirements(checkout: Path) -> list[str]:
    """The shipped checkout's own dependencies (no extras): what the controller needs to run, hatchling
    and editables among them (its editable install is built without isolation)."""
    return sorted(tomllib.loads((checkout / "pyproject.toml").read_text())["project"]["dependencies"])


def pack_checkout(root: Path | None = None) -> PackedProject:
    """This checkout's files the wheel is built from, as on disk (uncommitted changes included)."""
    root = root or find_checkout()
    files, sha, dirty = project_files(root)
    shipped = [f for f in files if f in SHIPPED or f.startswith(tuple(s for s in SHIPPED if s.endswith("/")))]
    states = file_states(root, shipped)
    return PackedProject(root, shipped, digest_of(states), sha, dirty, states)


def config_toml(settings: Settings, host: RemoteHost) -> str:
    """config.toml for the controller there: the settings it acts on, secrets included (the file is 0600).
    On this machine without a bucket, the folder standing for it is named, so both share this home's."""
    data = settings.model_dump(include=set(COPIED_SETTINGS), exclude_none=True)
    if bucket_record.configured(settings) is None and is_this_machine(host):
        data.setdefault("gcp", {})["bucket"] = "file://" + bucket_record.home_folder().name
    webhook = settings.notify.webhook_url
    if webhook is not None:
        data["notify"]["webhook_url"] = webhook.get_secret_value()
    return toml_text(data)


def toml_text(data: dict[str, Any]) -> str:
    """TOML of settings: tables, arrays of tables, and scalars or lists of them (strings as JSON writes them,
    which TOML reads alike for what settings hold)."""
    lines: list[str] = []

    def value(item: Any) -> str:
        if isinstance(item, list):
            return "[" + ", ".join(value(v) for v in item) + "]"
        return json.dumps(item, ensure_ascii=False)

    def table(name: str, body: dict[str, Any], header: str) -> None:
        scalars = {k: v for k, v in body.items() if not _is_table(v)}
        if name:
            lines.append(f"{header[0]}{name}{header[1]}")
        lines.extend(f"{key} = {value(v)}" for key, v in scalars.items())
        for key, v in body.items():
            full = f"{name}.{key}" if name else key
            if isinstance(v, dict):
                table(full, v, "[]")
            elif _is_table(v):
                for entry in v:
                    table(full, entry, ("[[", "]]"))

    table("", data, "[]")
    return "\n".join(lines) + "\n"


def _is_table(item: Any) -> bool:
    return isinstance(item, dict) or (isinstance(item, list) and bool(item) and isinstance(item[0], dict))


def _home(relative: str) -> str:
    return '"$HOME"/' + shlex.quote(relative)


def controller_command(verb: list[str], where: str = "") -> str:
    """`tpu-console controller VERB` as the console installed there runs it, with its own home."""
    named = f"{daemon.WHERE_ENV}={shlex.quote(where)} " if where else ""
    python = _home(f"{worker_recipes.ENV_DIR}/bin/python")
    env_dir = worker_recipes.ENV_DIR
    return (f"if [ ! -x {python} ]; then echo 'no controller installed there: no ~/{env_dir}'; "
            f"exit 3; fi; cd && TPU_CONSOLE_HOME={_home(HOME_DIR)} {named}{python} -m tpu_console controller "
            + " ".join(shlex.quote(part) for part in verb))


def install_code(digest: str) -> str:
    """Unpack the uploaded checkout into code/<digest>/ (once) and install it, editable, without
    dependencies, with the installer bootstrap chose (uv, else pip)."""
    code = _home(f"{CODE_DIR}/{digest}")
    return (
        f"( env={_home(worker_recipes.ENV_DIR)}; code={code}\n"
        'if [ ! -f "$code/pyproject.toml" ]; then rm -rf "$code.tmp" && mkdir -p "$code.tmp" && '
        'tar -xzf "$code.tar.gz" -C "$code.tmp" && mv "$code.tmp" "$code" || exit 21; fi\n'
        'rm -f "$code.tar.gz"\n'
        'echo "@@ step installing the console from its checkout"\n'
        'inst=$(cat "$env/.tpu-console-installer" 2>/dev/null); case "$inst" in "uv "*) '
        '"${inst#uv }" pip install -q --python "$env/bin/python" --reinstall --no-deps --no-build-isolation '
        '-e "$code";; *) "$env/bin/python" -m pip install -q --disable-pip-version-check --no-deps '
        '--no-build-isolation -e "$code";; esac || exit 22\n'
        'echo "@@ ready synced" )'
    )


async def fleet_of(host: RemoteHost) -> Fleet:
    """A fleet of one: the host."""
    provider = SshProvider(Settings(ssh=SshSettings(nodes=[host.ssh])))
    return Fleet(await provider.ssh_targets(await provider.get(host.ssh.name)))


async def start_on(settings: Settings, host: RemoteHost, *, detached: bool = False,
                   progress: Progress = no_progress) -> dict[str, Any]:
    """Install the console on `host` and start the controller there; what its `controller start --json`
    said (kind, detail, survives_reboot, log), with `host`."""
    refuse_unshared_store(settings, host)
    packed = await asyncio.to_thread(pack_checkout)
    linked = console_site_packages() if is_this_machine(host) else None
    version = console_python_version() if linked else checked_python_version(settings.workers.python)
    requirements = console_requirements(packed.root)
    spec = f"{'==' if linked else '>='}{version}"
    command, script = worker_recipes.bootstrap(
        None, version, requirements, environment_digest(requirements, spec, linked), exact=linked is not None,
        link_site_packages=linked, link_tools=console_tools() if linked else (),
        install_mirror=settings.workers.python_install_mirror)
    async with await fleet_of(host) as fleet:
        await require_all_reachable(fleet, host.label, [0], "nothing was installed")

        def on_line(_worker: int, text: str) -> None:
            progress(f"{host.label}: {text}")

        progress(f"{host.label}: the console's environment ({'linked to this machine' if linked else spec})")
        (made,) = await run_on_workers(fleet, command, [0], stdin=script, timeout=BOOTSTRAP_TIMEOUT_S,
                                       on_worker=on_line)
        _checked(made, host, "making its environment")
        progress(f"{host.label}: this checkout ({packed.digest}, {len(packed.files)} files)")
        tarball = await asyncio.to_thread(packed.tarball)
        for put in (await fleet.put(tarball, f"{CODE_DIR}/{packed.digest}.tar.gz", [0]),
                    await fleet.put(config_toml(settings, host).encode(), f"{HOME_DIR}/config.toml", [0],
                                    mode=0o600)):
            if not put[0].ok:
                raise UserError(f"{host.label}: upload failed ({put[0].error}); nothing was started")
        await asyncio.to_thread(remember, host)
        for line in await give_every_env(fleet, settings):
            progress(f"{host.label}: {line}")
        (installed,) = await run_on_workers(fleet, install_code(packed.digest), [0],
                                            timeout=COMMAND_TIMEOUT_S, on_worker=on_line)
        _checked(installed, host, "installing the console")
        verb = ["start", "--json", *(["--detached"] if detached else [])]
        (started,) = await fleet.run(controller_command(verb, host.label), [0], timeout=COMMAND_TIMEOUT_S)
    if not started.ok:
        raise UserError(f"{host.label}: `controller start` failed there: {_said(started)}")
    try:
        answer = json.loads(started.stdout[started.stdout.index("{"):])
    except ValueError:
        raise UserError(f"{host.label}: `controller start` there said {_said(started)!r}") from None
    return {**answer, "host": host.label}


async def run_there(host: RemoteHost, verb: list[str]) -> str:
    """`tpu-console controller VERB` on `host` (installed there by `start_on`); its output."""
    async with await fleet_of(host) as fleet:
        await require_all_reachable(fleet, host.label, [0], "nothing was done")
        (done,) = await fleet.run(controller_command(verb), [0], timeout=COMMAND_TIMEOUT_S)
    if not done.ok:
        raise UserError(f"{host.label}: `controller {verb[0]}` failed there: {_said(done)}")
    return (done.stdout + done.stderr).strip()


def _hosts_file() -> Path:
    return locations.home() / "controller" / "hosts.json"


def remember(host: RemoteHost) -> None:
    """Keep how to reach a host a controller was started on, by its label (the lease's `where`)."""
    path = _hosts_file()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known[host.label] = host.ssh.model_dump(mode="json")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(known, indent=1))
    partial.replace(path)


def known_host(label: str, settings: Settings) -> RemoteHost | None:
    """The host a lease's `where` names, as this console reaches it: one it started a controller on, or an
    [[ssh.nodes]] name; None otherwise."""
    try:
        known = json.loads(_hosts_file().read_text())
    except (OSError, ValueError):
        known = {}
    if label in known:
        return RemoteHost(label, SshNodeSettings.model_validate(known[label]))
    if label in {node.name for node in settings.ssh.nodes}:
        return resolve_host(label, settings)
    return None


async def _put_env_files(fleet: Fleet, runs: list[ManagedRun]) -> list[str]:
    """Each run's `.env`, read from the path it was launched with, into the controller's home there (0600,
    over SFTP); a line for each that was not given."""
    problems = []
    for run in runs:
        try:
            data = await asyncio.to_thread(secrets.read_env_file, run.job["env_file"])
        except UserError:
            problems.append(f"{run.id}: its .env {run.job['env_file']} is not on this machine; not given")
            continue
        (put,) = await fleet.put(data, f"{HOME_DIR}/{env_copies.relative_copy(run.id)}", [0], mode=0o600)
        if not put.ok:
            problems.append(f"{run.id}: its .env could not be uploaded ({put.error})")
    return problems


async def give_every_env(fleet: Fleet, settings: Settings) -> list[str]:
    """The `.env` of every managed run not yet ended, to the controller being started there."""
    from tpu_console.controller import state as st
    from tpu_console.controller.store import open_store

    try:
        stored = await asyncio.to_thread(st.all_runs, open_store(settings))
    except Exception as exc:  # noqa: BLE001 - an unreadable store: nothing to give, said so
        return [f"the managed runs could not be read ({one_line(exc)}); no .env was given"]
    runs = [s.run for s in stored if s.run.job.get("env_file") and not s.run.state.terminal]
    return await _put_env_files(fleet, runs)


async def give_env_files(host: RemoteHost, runs: list[ManagedRun]) -> str | None:
    """The runs' `.env` files to the controller on `host`; what went wrong, in a few words, or None."""
    async with await fleet_of(host) as fleet:
        if await unreachable_workers(fleet, [0]):
            return f"{host.label} did not answer"
        problems = await _put_env_files(fleet, runs)
    return "; ".join(problems) or None


def _checked(setup: Any, host: RemoteHost, doing: str) -> None:
    if not setup.ok:
        raise UserError(f"{host.label}: {doing} failed: {setup.error}; nothing was started")


def _said(result: Any) -> str:
    lines = (result.stderr or result.stdout or result.error or "").strip().splitlines()
    return lines[-1] if lines else f"exit {result.exit_status}"
