"""What each worker holds, asked in one round trip before a job is started or looked into: its environment,
code, versions and live runs (provision/report.py parses it), and the interpreter its jobs run with."""

from __future__ import annotations

import sys

from tpu_console.errors import UserError
from tpu_console.fleet.fleet import Fleet
from tpu_console.providers.base import Provider
from tpu_console.provision import worker_recipes as provision_recipes
from tpu_console.provision.report import WorkerReport
from tpu_console.provision.worker_recipes import ENV_PYTHON


def default_python(provider: Provider) -> str:
    """Local workers share this machine, so they run this very interpreter; elsewhere `python3`."""
    return sys.executable if provider.name == "local" else "python3"


def worker_python(provider: Provider, reports: list[WorkerReport]) -> str:
    """The interpreter for jobs on these workers: the environment `bootstrap` made when every worker has
    one, else this console's own on local pods (`python3` elsewhere, which `launch` then refuses)."""
    return ENV_PYTHON if all(r.env_present for r in reports) else default_python(provider)


async def inspect_workers(fleet: Fleet, workers: list[int], also: str = "") -> list[WorkerReport]:
    """Environment, code, versions and live runs of each worker, and what `also` asks, in one round trip."""
    command = provision_recipes.inspect_worker() + (f"\n{also}" if also else "")
    results = await fleet.run(command, workers, timeout=60)
    reports = []
    for result in results:
        if not result.ok:
            raise UserError(
                f"worker {result.worker} could not be inspected "
                f"({result.error or result.stderr.strip() or result.exit_status}); nothing was launched"
            )
        reports.append(WorkerReport.parse(result.worker, result.stdout))
    return reports
