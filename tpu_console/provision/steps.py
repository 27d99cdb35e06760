"""Running one provisioning recipe on a node's workers: every worker at once, each line of output passed on
as per-worker progress (secrets masked), and one `WorkerSetup` per worker at the end. Bootstrap, sync and
the checks before a launch all go through `run_on_workers`."""

from __future__ import annotations

import ipaddress
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tpu_console.domain import Node, SshTarget
from tpu_console.fleet.fleet import Fleet, WorkerLine, WorkerResult
from tpu_console.providers.base import Provider
from tpu_console.provision.report import WorkerReport
from tpu_console.secrets import SecretMasker

OnWorker = Callable[[int, str], None]


def ignore_worker(_worker: int, _text: str) -> None:
    pass


@dataclass
class WorkerSetup:
    """How one worker came out of a provisioning step."""

    worker: int
    ok: bool
    error: str | None
    report: WorkerReport
    seconds: float
    output_tail: list[str] = field(default_factory=list)  # the last installer lines, for a failure

    @property
    def versions(self) -> dict[str, str | None]:
        return self.report.versions

    @property
    def code(self) -> str:
        return self.report.code_label

    @property
    def summary(self) -> str:
        """One line for a person: what happened and the versions now there."""
        if not self.ok:
            return f"failed: {self.error}"
        what = {"already": "already in place", "installed": "installed", "synced": "code installed",
                "unpacked": "project unpacked", "cloned": "project cloned"}.get(
            self.report.ready or "", self.report.ready or "done"
        )
        return f"{what} in {self.seconds:.1f}s: {self.report.versions_label()}"


@dataclass
class SetupResult:
    node: Node
    workers: list[WorkerSetup]

    @property
    def ok(self) -> bool:
        return all(w.ok for w in self.workers)


async def run_on_workers(
    fleet: Fleet,
    command: str,
    workers: Sequence[int],
    *,
    stdin: str | None = None,
    timeout: float,
    on_worker: OnWorker = ignore_worker,
    masker: SecretMasker | None = None,
) -> list[WorkerSetup]:
    """Run `command` on `workers`; each output line goes to `on_worker` as it comes (the `@@` markers
    turned into words), and each worker's report is parsed from its output."""
    masker = masker or SecretMasker()
    reports = {w: WorkerReport(w) for w in workers}
    tails: dict[int, list[str]] = {w: [] for w in workers}
    started = time.monotonic()
    finished: dict[int, float] = {}

    def on_line(line: WorkerLine) -> None:
        text = masker.mask(line.text)
        said = reports[line.worker].add(text)
        if said is not None:
            on_worker(line.worker, said)
        elif text.strip() and not text.startswith("@@ "):
            tails[line.worker] = [*tails[line.worker][-19:], text]
            on_worker(line.worker, text)

    results: list[WorkerResult] = await fleet.run(
        command, workers, stdin=stdin, timeout=timeout, on_line=on_line
    )
    out = []
    for result in results:
        finished[result.worker] = time.monotonic() - started
        report = reports[result.worker]
        error = None
        if not result.ok:
            error = (
                report.error or result.error or _last(tails[result.worker]) or f"exit {result.exit_status}"
            )
        out.append(
            WorkerSetup(result.worker, result.ok, error, report, result.duration_s, tails[result.worker])
        )
    return out


def _last(lines: list[str]) -> str | None:
    return lines[-1] if lines else None


def shares_console_machine(provider: Provider, targets: Sequence[SshTarget]) -> bool:
    """Local pods, and ssh nodes whose every host is this machine's loopback: their workers can see the
    console's installed packages, so bootstrap links them rather than downloading them per worker."""
    if provider.name == "local":
        return True
    try:
        return bool(targets) and all(
            t.host == "localhost" or ipaddress.ip_address(t.host).is_loopback for t in targets
        )
    except ValueError:
        return False


def console_site_packages() -> str:
    """The console's own site-packages (its virtual environment's, when it runs in one)."""
    return sysconfig.get_paths(vars={"base": sys.prefix, "platbase": sys.prefix})["purelib"]
