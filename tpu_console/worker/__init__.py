"""What runs on a TPU host, shipped there by the console: the command channel's agent (agent.py), the run
watch's follower (run_follower.py), the job wrapper (job_wrapper.sh), the run's supervisor (supervisor.py)
and job runner (job_runner.py), the libtpu metrics probe (libtpu_probe.py) and the bootstrap script
(bootstrap.sh).

Everything here runs under whatever python3 the worker has (3.8+) with its standard library only, and imports
nothing from the rest of tpu_console (tests/test_layers.py checks both). The console reaches these
files through fleet/ and provision/, which ship them, and providers/local/, whose worker servers are the
local pods' hosts.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def source(name: str) -> bytes:
    """The bytes of one file of this package, as they are sent to a worker."""
    return (HERE / name).read_bytes()
