"""A Python program to run on a worker, and how it gets there.

Some work on a worker is best done by a small program rather than a shell pipeline (the run watch's
follower streams files for hours). Such a program uses the standard library only and runs on Python
3.8+, whatever python3 the worker has. On the command channel the agent runs it in a fork of itself, so no
interpreter has to start (worker/agent.py, PYTHON frames); on the exec path it is
`python3 -I -S -c <loader> ARGS...` with its source on stdin. Either way nothing but the loader and the
arguments shows on a command line.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass


def python_from_stdin(python: str, source_bytes: int) -> str:
    """A command line that runs a Python program read from the first `source_bytes` bytes of stdin (the
    command channel's agent, a PythonProgram on the exec path). -I -S: no user site, no site-packages, no
    PYTHON* variables: the standard library only, fast to start."""
    return f"exec {python} -I -S -c 'import sys;exec(sys.stdin.buffer.read({int(source_bytes)}))'"


@dataclass(frozen=True)
class PythonProgram:
    source: bytes
    args: tuple[str, ...] = ()  # its sys.argv[1:]
    python: str = "python3"  # on the exec path: the interpreter, looked up on the worker's PATH

    def command_line(self) -> str:
        """The exec path's command; its stdin must be `source`."""
        words = [python_from_stdin(self.python, len(self.source)), *(shlex.quote(a) for a in self.args)]
        return " ".join(words)
