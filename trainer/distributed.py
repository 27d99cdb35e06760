"""Starting JAX's multi-process runtime and the guard against a partly launched pod.

The console (local and ssh pods) names the coordinator and this process's id in the environment; on a Cloud
TPU VM, `jax.distributed.initialize()` discovers its peers by itself. A run that sees fewer processes than
the pod has (only worker 0 was launched) fails at once instead of training slowly on a fraction of the chips.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ENV_COORDINATOR = "TRAINER_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "TRAINER_NUM_PROCESSES"
ENV_PROCESS_ID = "TRAINER_PROCESS_ID"
ENV_REQUIRE_PROCESS_COUNT = "TRAINER_REQUIRE_PROCESS_COUNT"
# Seconds; lowered by tests so a broken multi-process run fails fast instead of waiting 5 minutes.
ENV_INIT_TIMEOUT = "TRAINER_DISTRIBUTED_INIT_TIMEOUT_S"
ENV_HEARTBEAT_TIMEOUT = "TRAINER_DISTRIBUTED_HEARTBEAT_TIMEOUT_S"


class LaunchError(RuntimeError):
    """The processes of this run do not match the pod (e.g. only some workers launched)."""


class Terminated(RuntimeError):
    """The process was asked to stop (SIGTERM from the console's stop, SIGINT from a terminal)."""

    def __init__(self, signum: int) -> None:
        import signal

        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@dataclass(frozen=True)
class LaunchEnv:
    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    require_process_count: int | None
    init_timeout_s: int
    heartbeat_timeout_s: int

    @property
    def explicit(self) -> bool:
        return self.coordinator is not None


def _int_env(name: str, env: dict[str, str]) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{name}={raw!r} is not an integer; set it to a whole number or unset it") from None


def read_launch_env(env: dict[str, str] | None = None) -> LaunchEnv:
    env = dict(os.environ if env is None else env)
    launch = LaunchEnv(
        coordinator=env.get(ENV_COORDINATOR, "").strip() or None,
        num_processes=_int_env(ENV_NUM_PROCESSES, env),
        process_id=_int_env(ENV_PROCESS_ID, env),
        require_process_count=_int_env(ENV_REQUIRE_PROCESS_COUNT, env),
        init_timeout_s=_int_env(ENV_INIT_TIMEOUT, env) or 300,
        heartbeat_timeout_s=_int_env(ENV_HEARTBEAT_TIMEOUT, env) or 100,
    )
    if launch.explicit and (launch.num_processes is None or launch.process_id is None):
        raise LaunchError(f"{ENV_COORDINATOR} is set but {ENV_NUM_PROCESSES} or {ENV_PROCESS_ID} is not; "
                          "set all three, or none on a TPU VM")
    if launch.explicit and not 0 <= launch.process_id < launch.num_processes:
        raise LaunchError(f"{ENV_PROCESS_ID}={launch.process_id} is outside 0..{launch.num_processes - 1}")
    return launch


def process_id_hint(env: dict[str, str] | None = None) -> int:
    """This process's index before JAX runs (for events written while validating the config)."""
    try:
        return _int_env(ENV_PROCESS_ID, dict(os.environ if env is None else env)) or 0
    except LaunchError:
        return 0


def has_tpu_chips() -> bool:
    """TPU chips attached to this machine (their device files), whatever the environment says."""
    return Path("/dev/accel0").exists() or Path("/dev/vfio/0").exists()


def on_tpu_vm() -> bool:
    """A Cloud TPU VM, where JAX finds its peers from the VM metadata."""
    named = os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("TPU_ACCELERATOR_TYPE")
    return bool(named) or has_tpu_chips()


def initialize(launch: LaunchEnv) -> None:
    """Start jax.distributed: explicit from the environment, automatic on a TPU VM, skipped otherwise."""
    import signal

    import jax

    # jax.distributed installs its own SIGTERM handler (the coordination service's preemption notifier),
    # which swallows the signal: a stopped run would then hang until SIGKILL. Take SIGTERM back afterwards,
    # so `tpu-console stop` ends the run with an `error` event and status 143.
    sigterm_handler = signal.getsignal(signal.SIGTERM)
    try:
        _initialize(launch, jax)
    finally:
        if sigterm_handler is not None:
            signal.signal(signal.SIGTERM, sigterm_handler)


def _initialize(launch: LaunchEnv, jax) -> None:

    if launch.explicit:
        # If a peer never comes, JAX aborts the process at the timeout (no exception): this line is then the
        # last thing in the log, and says what it was waiting for.
        print(f"info: jax.distributed: process {launch.process_id} of {launch.num_processes}, coordinator "
              f"{launch.coordinator}, waiting up to {launch.init_timeout_s}s for every process", flush=True)
        jax.distributed.initialize(
            coordinator_address=launch.coordinator,
            num_processes=launch.num_processes,
            process_id=launch.process_id,
            initialization_timeout=launch.init_timeout_s,
            heartbeat_timeout_seconds=launch.heartbeat_timeout_s,
        )
    elif on_tpu_vm():
        print(f"info: jax.distributed: Cloud TPU VM, peers from the VM metadata, waiting up to "
              f"{launch.init_timeout_s}s for every worker", flush=True)
        jax.distributed.initialize(initialization_timeout=launch.init_timeout_s,
                                   heartbeat_timeout_seconds=launch.heartbeat_timeout_s)


def initialize_or_explain(launch: LaunchEnv, expected: int | None) -> None:
    """`initialize`, turning a failed rendezvous on a multi-worker pod into the message that names the fix."""
    try:
        initialize(launch)
    except Exception as exc:
        if not expected or expected < 2:
            raise
        cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise LaunchError(f"Expected {expected} JAX processes but jax.distributed.initialize() failed "
                          f"({cause}): are all workers launched? "
                          "launch on all workers (--worker all)") from exc


def require_process_count(expected: int | None, actual: int) -> None:
    """Fail fast when the run sees a different number of JAX processes than the pod has workers."""
    if expected is None or expected == actual:
        return
    if actual < expected:
        raise LaunchError(f"Expected {expected} JAX processes but jax.process_count()=={actual}: only some "
                          f"workers were launched; launch on all workers (--worker all)")
    raise LaunchError(f"Expected {expected} JAX processes but jax.process_count()=={actual}: more processes "
                      f"joined than the pod has workers; check {ENV_NUM_PROCESSES} and the coordinator")
