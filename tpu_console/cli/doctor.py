"""`tpu-console doctor NODE`: every chip, link and port of a node checked at once (tpu_console/doctor/,
docs/doctor.md); exit status 0 healthy, 1 with a finding."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tpu_console.cli import flags, output
from tpu_console.doctor import DoctorReport, check_node
from tpu_console.doctor.check import DEADLINE_S, STALL_S
from tpu_console.errors import UserError
from tpu_console.providers.base import Provider
from tpu_console.settings import Settings


def add_verbs(verbs: Any, common: argparse.ArgumentParser) -> None:
    doctor = verbs.add_parser(
        "doctor", parents=[common], help="check every chip, link and port of a node at once",
        description="On every worker at once: each chip's matmul (its checksum known) and an HBM pattern; "
        "all-reduce rings along the mesh's axes timed against the interconnect (the planner's figures), "
        "split in halves down to one host to find the slow host or link; transfers between slices; the JAX "
        "coordinator's and megascale's ports. A fault is named in one line with its fix (docs/doctor.md). "
        "Exit status 0 when all is well, 1 with a finding.",
    )
    doctor.add_argument("node")
    add_check_options(doctor)


def add_check_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """The doctor's options, shared with `launch --check` (there prefixed `--check-`)."""
    if not prefix:
        flags.add_python(parser, "interpreter with JAX on the workers (default: bootstrap's environment; "
                         "this interpreter on local pods)")
    parser.add_argument(f"--{prefix}stall", type=float, default=STALL_S, metavar="S",
                        help=f"stop the check when no worker made progress for S seconds ({STALL_S:g})")
    parser.add_argument(f"--{prefix}deadline", type=float, default=DEADLINE_S, metavar="S",
                        help=f"stop the check after S seconds whatever it did ({DEADLINE_S:g})")


def check_numbers(stall: float, deadline: float) -> None:
    if stall <= 0 or deadline <= 0:
        raise UserError(f"--stall and --deadline are seconds above 0 (got {stall:g}, {deadline:g})")


async def doctor(args: argparse.Namespace, settings: Settings, providers: dict[str, Provider]) -> int:
    check_numbers(args.stall, args.deadline)
    report = await check_node(providers, args.node, python=args.python, stall_s=args.stall,
                              deadline_s=args.deadline, progress=output.progress)
    show(report, args.json)
    return 0 if report.ok else 1


def show(report: DoctorReport, json_mode: bool) -> None:
    if json_mode:
        output.print_json(report.to_json())
        return
    stream = sys.stdout if report.ok else sys.stderr
    for line in report.lines():
        print(line if report.ok else f"doctor: {line}", file=stream)


HANDLERS = {"doctor": doctor}
