"""A managed run's `.env` where its controller runs: never in the store, a log, a state record or a command
line, since it holds the run's secrets.

The run's record keeps only the path it was launched with (`job["env_file"]`, a file of the launching
console's machine). A controller launches with, in order:

1. its own copy, `$TPU_CONSOLE_HOME/controller/env/<managed id>.env` (0600), which the console that
   launched the run gives it over SFTP (remote.py `give_env_files`): at hand-over, when the acting
   controller is on another machine this console started it on, and at every `controller start --on HOST`
   or `--gce`, for every managed run not yet ended;
2. else the file at the recorded path, when it is there (the controller on the launching machine itself).

Without either, the recovery waits before it makes anything, its note naming the command that gives the
copy (`missing`). The copy is removed once the run has ended (`forget`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tpu_console import locations
from tpu_console.controller.lease import WHERE_ENV
from tpu_console.errors import UserError

FOLDER = "controller/env"  # in a controller's home


def copy_path(managed_id: str) -> Path:
    return locations.home() / FOLDER / f"{managed_id}.env"


def relative_copy(managed_id: str) -> str:
    """Where the copy goes, relative to the controller's home (SFTP puts it there)."""
    return f"{FOLDER}/{managed_id}.env"


def missing(managed_id: str, job: dict[str, Any]) -> str | None:
    """Why this controller cannot give the run its `.env`, with the fix; None when it can (or none)."""
    path = job.get("env_file")
    if not path or copy_path(managed_id).is_file() or Path(path).is_file():
        return None
    started_as = os.environ.get(WHERE_ENV)  # the host's label when started there by another console
    if not started_as:
        return (f"this controller has no copy of the run's .env and {path} is not here; put the file back "
                "there")
    return (f"this controller has no copy of the run's .env ({path} on the machine that launched it); run "
            f"{start_again(started_as)} from that console, which gives it the .env of every managed run")


def start_again(where: str) -> str:
    """The command that starts the controller at `where` (a lease's label: a host, or `gce:ZONE/NAME`)
    again from the launching console, giving it every managed run's `.env`."""
    if where.startswith("gce:"):
        return f"`tpu-console controller start --gce --zone {where.removeprefix('gce:').partition('/')[0]}`"
    return f"`tpu-console controller start --on {where}`"


def forget(managed_id: str) -> None:
    """Remove this controller's copy once the run has ended (the loop, every pass)."""
    copy_path(managed_id).unlink(missing_ok=True)


def env_file_for(managed_id: str, job: dict[str, Any]) -> str | None:
    """The `.env` to launch the run with (None: it has none); UserError when this controller has none."""
    if (why := missing(managed_id, job)) is not None:
        raise UserError(why)
    if not job.get("env_file"):
        return None
    own = copy_path(managed_id)
    return str(own) if own.is_file() else str(job["env_file"])
