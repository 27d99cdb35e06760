"""What the run's supervisor on the pod is asked to do (worker/supervisor.py runs it), and what it decided.

Pure: no I/O. `launch` turns its flags into a `SupervisionPolicy`, checks it against the node (one-line
errors before anything is sent), and writes `plan(...)` as `supervision.json` in every worker's run folder;
the supervisor writes its decisions to `supervisor.jsonl`, read back here by `parse_decisions`.

The failure classes a restart can name come from the console's log signatures (observe/signatures.py): the
job runner on every worker classifies its job's log with the very patterns `signatures.patterns()` gives,
shipped in the plan, so there is one source of truth for what a log line means.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets as token_source
from dataclasses import dataclass, field
from typing import Any

from tpu_console.errors import UserError
from tpu_console.observe import signatures, stragglers
from tpu_console.observe.health import Thresholds

DECISIONS_FILE = "supervisor.jsonl"
PLAN_FILE = "supervision.json"
NOTIFY_FILE = ".notify"
PORT_FILE = "supervisor.port"
PID_FILE = "supervisor.pid"
ADDRESS_ENV = "TPU_CONSOLE_SUPERVISOR"

# Failures that another try can cure: a worker lost, jax.distributed timing out, the TPU held by a
# previous process, the node preempted. Never retried: OOM, a traceback in the user's code, a config the
# trainer refused, W&B refusing its key (another try fails the same way).
TRANSIENT = (signatures.LOST_WORKER, signatures.DISTRIBUTED_TIMEOUT, signatures.TPU_IN_USE,
             signatures.PREEMPTED)
NEVER = (signatures.OOM, signatures.EXCEPTION, signatures.WRONG_PROCESS_COUNT, signatures.WANDB_AUTH,
         signatures.WANDB_INIT, "config")
ON_END = ("keep", "delete")
ON_STRAGGLER = ("report", "restart")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


@dataclass(frozen=True)
class SupervisionPolicy:
    fail_fast: bool = False
    on_end: str = "keep"
    grace_s: float = 600.0
    max_cost: float | None = None
    price_per_hour: float | None = None  # overrides the price table (local and ssh pods have none)
    max_hang_s: float | None = None
    restart_on: tuple[str, ...] = ()
    max_restarts: int = 3
    on_straggler: str | None = None  # report | restart: what the supervisor does about a straggler
    heartbeat_s: float = 2.0
    lost_after_s: float = 60.0
    stop_grace_s: float = 10.0

    @property
    def deletes(self) -> bool:
        """Whether the supervisor may delete the node (so the provider must allow it from the pod)."""
        return self.on_end == "delete" or self.max_cost is not None or self.max_hang_s is not None


@dataclass(frozen=True)
class Decision:
    t: float
    decision: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


def parse_duration(text: str, flag: str) -> float:
    """`90`, `90s`, `10m`, `1.5h` -> seconds; a UserError naming the flag otherwise."""
    match = _DURATION.match(str(text))
    if not match:
        raise UserError(f"{flag} {text!r} is not a duration; give seconds, or a number with s, m or h "
                        "(e.g. 10m)")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return value * {"s": 1, "m": 60, "h": 3600}[unit]


def parse_restart_on(text: str) -> tuple[str, ...]:
    """`transient` (every transient class) or a comma-separated list of them."""
    classes: list[str] = []
    for name in (part.strip().replace("-", "_") for part in text.split(",") if part.strip()):
        if name == "transient":
            classes.extend(TRANSIENT)
        elif name in TRANSIENT:
            classes.append(name)
        elif name in NEVER:
            raise UserError(f"--restart-on {name}: a {name} failure fails the same way again and is never "
                            f"restarted; choose from transient, {', '.join(TRANSIENT)}")
        else:
            raise UserError(f"--restart-on {name!r} is not a failure class; choose from transient, "
                            f"{', '.join(TRANSIENT)}")
    if not classes:
        raise UserError("--restart-on is empty; give transient, or classes among " + ", ".join(TRANSIENT))
    return tuple(dict.fromkeys(classes))


def parse_amount(text: str | float, flag: str) -> float:
    """`20`, `4.2` -> USD; a UserError naming the flag otherwise."""
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{flag} {text!r} is not an amount; give a number of USD (e.g. 20)") from None


def parse_count(text: str | int, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a whole number; give one, e.g. 3") from None


def policy_from_options(
    *,
    fail_fast: bool = False,
    on_end: str = "keep",
    grace: str | None = None,
    max_cost: str | float | None = None,
    price_per_hour: str | float | None = None,
    max_hang: str | None = None,
    restart_on: str | None = None,
    max_restarts: str | int | None = None,
    on_straggler: str | None = None,
) -> SupervisionPolicy:
    """The policy from launch's options as the user gave them (the CLI's flags, the app's launch form);
    None (or blank) is "off", and every bad value is a one-line UserError naming its flag."""
    def given(value: Any) -> Any:
        return None if value is None or (isinstance(value, str) and not value.strip()) else value

    grace, max_cost, price_per_hour = given(grace), given(max_cost), given(price_per_hour)
    max_hang, restart_on, max_restarts = given(max_hang), given(restart_on), given(max_restarts)
    if on_end not in ON_END:
        raise UserError(f"--on-end {on_end!r}: choose keep or delete")
    if on_end != "delete" and grace is not None:
        raise UserError("--grace is how long after the run the node is deleted; add --on-end delete")
    if max_restarts is not None and not restart_on and on_straggler != "restart":
        raise UserError("--max-restarts counts restarts; add --restart-on transient")
    on_straggler = given(on_straggler)
    if on_straggler is not None and on_straggler not in ON_STRAGGLER:
        raise UserError(f"--on-straggler {on_straggler!r}: choose report or restart")
    return SupervisionPolicy(
        fail_fast=fail_fast,
        on_end=on_end,
        grace_s=parse_duration(grace, "--grace") if grace is not None else SupervisionPolicy.grace_s,
        max_cost=parse_amount(max_cost, "--max-cost") if max_cost is not None else None,
        price_per_hour=(parse_amount(price_per_hour, "--price-per-hour") if price_per_hour is not None
                        else None),
        max_hang_s=parse_duration(max_hang, "--max-hang") if max_hang is not None else None,
        restart_on=parse_restart_on(restart_on) if restart_on else (),
        max_restarts=(parse_count(max_restarts, "--max-restarts") if max_restarts is not None
                      else SupervisionPolicy.max_restarts),
        on_straggler=on_straggler,
    )


def check_policy(policy: SupervisionPolicy, provider: str, can_delete: bool, price: float | None) -> None:
    """UserError for a policy the node cannot honour; nothing has been sent yet."""
    if policy.on_end not in ON_END:
        raise UserError(f"--on-end {policy.on_end!r}: choose keep or delete")
    if policy.max_restarts < 0:
        raise UserError(f"--max-restarts {policy.max_restarts} is negative; give 0 or more")
    for name, value in (("--grace", policy.grace_s), ("--max-hang", policy.max_hang_s),
                        ("--max-cost", policy.max_cost), ("--price-per-hour", policy.price_per_hour)):
        if value is not None and value < 0:
            raise UserError(f"{name} is negative; give a positive value")
    if policy.deletes and not can_delete:
        raise UserError(f"a {provider} node cannot be deleted from the pod, so --on-end delete, --max-cost "
                        "and --max-hang need a gcp or local node; leave them out")
    if policy.max_cost is not None and price is None:
        raise UserError(f"--max-cost needs the node's price and the price table has none for this {provider} "
                        "node; give it with --price-per-hour USD")


def plan(
    *,
    policy: SupervisionPolicy,
    delete_target: dict[str, Any] | None,
    bind: str,
    coordinator_host: str | None,
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """supervision.json: the supervisor's orders and what the job runners are told (no secret but the
    run's own token, and the file is 0600). The console's facts the supervisor judges by travel in it
    (health's thresholds, how a local pod is removed, where the run's record goes: history/bucket_record.py),
    so the supervisor keeps no copy of them. The run's own facts (its id, node, provider, workers, start,
    price, fail-fast) are not repeated here: they are in its record, launch.json (worker/run_record.py),
    which launch writes beside this file before the supervisor starts."""
    return {
        "token": token_source.token_urlsafe(24),
        "bind": bind,
        "coordinator_host": coordinator_host,
        "on_end": policy.on_end,
        "grace_s": policy.grace_s,
        "max_cost": policy.max_cost,
        "max_hang_s": policy.max_hang_s,
        "restart_on": list(policy.restart_on),
        "max_restarts": policy.max_restarts,
        "on_straggler": policy.on_straggler,
        # observe/stragglers.py's rule, as the supervisor applies it to the steps its runners report
        "pace": {"window": stragglers.WINDOW, "min_steps": stragglers.MIN_STEPS, "factor": stragglers.FACTOR,
                 "min_excess_s": stragglers.MIN_EXCESS_S},
        "heartbeat_s": policy.heartbeat_s,
        "lost_after_s": policy.lost_after_s,
        "stop_grace_s": policy.stop_grace_s,
        "delete": delete_target if policy.deletes else None,
        "signatures": [[kind, pattern] for kind, pattern in signatures.patterns()],
        "thresholds": dataclasses.asdict(Thresholds()),
        "record": record,
    }


def notify_file(webhook_url: str) -> bytes:
    """`.notify`: the webhook URL, for the supervisor only (uploaded 0600, never on a command line)."""
    return json.dumps({"webhook_url": webhook_url}).encode() + b"\n"


def parse_decisions(text: str) -> list[Decision]:
    decisions = []
    for line in text.splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "decision" in data:
            extra = {k: v for k, v in data.items() if k not in ("t", "decision", "message")}
            decisions.append(Decision(float(data.get("t", 0)), str(data["decision"]),
                                      str(data.get("message", "")), extra))
    return decisions


def restarts(decisions: list[Decision]) -> dict[str, int]:
    """Restarts by failure class, from the decisions."""
    counts: dict[str, int] = {}
    for d in decisions:
        if d.decision == "restart":
            cause = str(d.fields.get("cause", "unknown"))
            counts[cause] = counts.get(cause, 0) + 1
    return counts
