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


def bundle(main: str, *modules: str) -> bytes:
    """One Python program that runs the file `main` as __main__ with the files `modules` importable by their
    bare names (`import agent_frames`): for a program sent over stdin, which has no folder of its own to
    import its modules from (the command channel's agent). Each file is compiled under its own name, so a
    traceback names it."""
    lines = ["import sys, types"]
    for name in modules:
        module = name[: -len(".py")]
        lines += [f"sys.modules[{module!r}] = types.ModuleType({module!r})",
                  f"exec(compile({source(name)!r}, {name!r}, 'exec'), sys.modules[{module!r}].__dict__)"]
    lines.append(f"exec(compile({source(main)!r}, {main!r}, 'exec'))")
    return "\n".join(lines).encode() + b"\n"
