"""Where the controller's loop runs with nobody watching: `tpu-console controller start` on this machine,
as a systemd user service where `systemctl --user` works (it survives the terminal, and a reboot where the
user's services linger: `loginctl enable-linger`), else as a detached process (it survives the terminal,
not a reboot); `--on HOST` installs the console on an SSH host and does the same there (remote.py).

`python -m tpu_console.controller.daemon serve` is the daemon itself: the providers and the store of this
console home's settings, one Controller serving every managed run, its log in `controller/controller.log`,
a SIGTERM a clean stop (the lease given back at once). One controller serves a project: a second one
started against the same store waits for the lease and takes over only when the first stops renewing it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tpu_console import locations
from tpu_console.controller.lease import WHERE_ENV  # how the daemon names itself in its lease
from tpu_console.errors import UserError

UNIT = "tpu-console-controller.service"
POLL_S = 15.0


def folder() -> Path:
    path = locations.home() / "controller"
    path.mkdir(parents=True, exist_ok=True)
    return path


def log_file() -> Path:
    return folder() / "controller.log"


def pid_file() -> Path:
    return folder() / "daemon.pid"


def serve_command() -> list[str]:
    return [sys.executable, "-m", "tpu_console.controller.daemon", "serve"]


@dataclass(frozen=True)
class Started:
    kind: str  # "systemd" or "detached"
    detail: str  # the unit, or the pid
    survives_reboot: bool
    why: str  # one line for a person: what it is and what it survives


def systemd_works() -> bool:
    """Whether `systemctl --user` reaches a user manager here (not in most containers, nor over plain SSH
    without a login session)."""
    if shutil.which("systemctl") is None:
        return False
    done = subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True, timeout=10)
    return done.returncode == 0


def lingering() -> bool:
    """Whether this user's services run without a login (so they start again after a reboot)."""
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or ""
    if not user or shutil.which("loginctl") is None:
        return False
    done = subprocess.run(["loginctl", "show-user", user, "-p", "Linger"], capture_output=True, text=True,
                          timeout=10)
    return done.stdout.strip() == "Linger=yes"


def unit_text() -> str:
    command = " ".join(shlex.quote(part) for part in serve_command())
    where = os.environ.get(WHERE_ENV)
    named = f"Environment={shlex.quote(f'{WHERE_ENV}={where}')}\n" if where else ""
    return (
        "[Unit]\nDescription=tpu-console controller: brings managed runs back after preemptions\n"
        "After=network-online.target\n\n"
        f"[Service]\nExecStart={command}\nEnvironment=TPU_CONSOLE_HOME={locations.home()}\n{named}"
        "Restart=always\nRestartSec=5\n\n[Install]\nWantedBy=default.target\n"
    )


def start(use_systemd: bool | None = None) -> Started:
    """Start the daemon here (nothing is started when one already runs: its description)."""
    running = status()
    if running is not None:
        return running
    if use_systemd if use_systemd is not None else systemd_works():
        unit = Path.home() / ".config" / "systemd" / "user" / UNIT
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(unit_text())
        for args in (["daemon-reload"], ["enable", "--now", UNIT]):
            done = subprocess.run(["systemctl", "--user", *args], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise UserError(f"systemctl --user {' '.join(args)} failed: {done.stderr.strip()}")
        linger = lingering()
        return Started("systemd", UNIT, linger,
                       f"a systemd user service ({UNIT}): survives this terminal; "
                       + ("survives a reboot (lingering is on)" if linger else
                          "survives a reboot only with `loginctl enable-linger` (off now)"))
    with log_file().open("ab") as log:
        process = subprocess.Popen(serve_command(), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   start_new_session=True, env={**os.environ,
                                                                "TPU_CONSOLE_HOME": str(locations.home())})
    pid_file().write_text(f"{process.pid}\n")
    return Started("detached", str(process.pid), False,
                   f"a detached process (pid {process.pid}; no systemd user manager here): survives this "
                   "terminal, not a reboot")


def _pid() -> int | None:
    try:
        pid = int(pid_file().read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


def status() -> Started | None:
    """The daemon of this console home, if one runs."""
    if shutil.which("systemctl") is not None:
        done = subprocess.run(["systemctl", "--user", "is-active", UNIT], capture_output=True, text=True,
                              timeout=10)
        if done.stdout.strip() == "active":
            linger = lingering()
            return Started("systemd", UNIT, linger, f"a systemd user service ({UNIT})")
    pid = _pid()
    if pid is not None:
        return Started("detached", str(pid), False, f"a detached process (pid {pid})")
    return None


def stop() -> Started | None:
    """Stop the daemon (its lease given back); what was stopped, or None when none ran."""
    running = status()
    if running is None:
        return None
    if running.kind == "systemd":
        subprocess.run(["systemctl", "--user", "disable", "--now", UNIT], capture_output=True, timeout=60)
        return running
    pid = int(running.detail)
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if _pid() is None:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    pid_file().unlink(missing_ok=True)
    return running


def logs(lines: int = 50) -> list[str]:
    try:
        text = log_file().read_text(errors="replace")
    except FileNotFoundError:
        return []
    return text.splitlines()[-lines:]


async def serve(poll_s: float = POLL_S) -> None:
    """The daemon: every managed run of this home's store, until SIGTERM."""
    from tpu_console.controller.loop import Controller
    from tpu_console.controller.store import open_store
    from tpu_console.observe.notifications import Notifier
    from tpu_console.providers.registry import build_providers, close_providers
    from tpu_console.settings import load_settings

    settings = load_settings()
    log = logging.getLogger("tpu-console.controller")
    providers = build_providers(settings)
    webhook = settings.notify.webhook_url
    notifier = Notifier(webhook, False, log.warning)
    where = os.environ.get(WHERE_ENV) or os.uname().nodename
    controller = Controller(providers, open_store(settings), poll_s=poll_s, where=where,
                            webhook_url=webhook.get_secret_value() if webhook else None,
                            notify=notifier.notify, progress=log.info)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    log.info("controller %s serving %s every %g s", controller.id, controller.store.place, poll_s)
    try:
        await controller.serve(until=stopping.is_set, wake=stopping)
    finally:
        await close_providers(providers)
        log.info("controller %s stopped; lease given back", controller.id)


def main(argv: list[str]) -> int:
    if argv[:1] != ["serve"]:
        print("usage: python -m tpu_console.controller.daemon serve [POLL_S]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(message)s", datefmt="%Y-%m-%dT%H:%M:%S")
    # POLL_S, or TPU_CONSOLE_CONTROLLER_POLL_S (a start's environment: tests and benchmarks look often)
    poll = argv[1] if len(argv) > 1 else os.environ.get("TPU_CONSOLE_CONTROLLER_POLL_S") or POLL_S
    asyncio.run(serve(float(poll)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
