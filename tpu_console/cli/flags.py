"""Options several verbs share, each defined once (`--worker`, `--python`, `--env-file`, `--yes`, `--json`,
`--config` with `--set`, a run's NODE|RUN_ID target), and the settings flags (`--project`,
`--internal-ip`) that override config.toml."""

from __future__ import annotations

import argparse
from typing import Any

WORKERS_HELP = "workers: all (default), 0, 0,2, 1-3, or a mix such as 0,2-3"


def common_parent() -> argparse.ArgumentParser:
    """Options every verb accepts, so they may follow the verb: `tpu-console ls --json`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout at the end")
    add_settings_flags(common, default=argparse.SUPPRESS)
    return common


def add_settings_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--project", default=default, help="gcp project (overrides gcp.project)")
    parser.add_argument(
        "--internal-ip",
        action="store_true",
        default=default,
        help="reach gcp workers on their internal IPs (from inside the VPC)",
    )


def settings_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags that override config.toml and the environment, as a nested settings dict."""
    return {
        "gcp": {"project": getattr(args, "project", None), "internal_ip": getattr(args, "internal_ip", None)}
    }


def add_worker(parser: argparse.ArgumentParser, help: str = WORKERS_HELP) -> None:
    parser.add_argument("--worker", default="all", metavar="SEL", help=help)


def add_python(parser: argparse.ArgumentParser, help: str | None = None, default: str | None = None) -> None:
    parser.add_argument(
        "--python", default=default, metavar="PY",
        help=help or "interpreter on the workers (default as for launch)",
    )


def add_env_file(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--env-file", metavar="PATH", help=help)


def add_yes(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--yes", action="store_true", help=help)


def add_config(parser: argparse.ArgumentParser, set_help: str, required: bool = True) -> None:
    """`--config FILE` (required unless said otherwise) and the repeatable `--set KEY=VALUE` overrides."""
    parser.add_argument("--config", required=required, metavar="FILE", help="trainer YAML config")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help
    )


def add_node_or_type(parser: argparse.ArgumentParser) -> None:
    """NODE, or `--type T` for a TPU type without a node (plan, sweep --compile-only)."""
    parser.add_argument("node", nargs="?", help="a node: plan for its accelerator type")
    parser.add_argument(
        "--type", dest="accelerator_type", metavar="TYPE",
        help="a TPU type instead of a node, e.g. v6e-16 (no node needed)",
    )


def add_run_target(parser: argparse.ArgumentParser) -> None:
    """A run named by its id, or by its node (the node's latest run) and optionally one of its runs."""
    parser.add_argument("target", metavar="NODE|RUN_ID", help="a run id, or a node (its latest run)")
    parser.add_argument("run_id", metavar="RUN_ID", nargs="?", help="with a node: one of its runs")
