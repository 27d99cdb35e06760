"""What a worker's environment must hold to run the trainer: the `trainer` extra of this distribution, the
two console libraries the trainer's config uses (pydantic, PyYAML), hatchling to build a git checkout, and
JAX in the right flavour. The console's own dependencies (textual, asyncssh, ...) never go to a worker:
the code itself is installed with --no-deps by `sync`. py-spy too, for `stacks` of any Python program."""

from __future__ import annotations

import hashlib
import json
import re
from importlib import metadata
from typing import Literal

JaxFlavour = Literal["tpu", "cpu"]
# py-spy: `tpu-console stacks` dumps any Python program's stacks with it.
_ALSO_NEEDED = ("pydantic>=2.7", "pyyaml>=6.0", "hatchling>=1.24", "py-spy>=0.3.14")
_EXTRA = re.compile(r"""extra\s*==\s*["']trainer["']""")


def trainer_requirements(jax: JaxFlavour) -> list[str]:
    """The requirement strings, `jax` turned into `jax[tpu]` for TPU VMs (which brings libtpu)."""
    declared = metadata.requires("tpu-console") or []
    wanted = [spec.split(";")[0].strip() for spec in declared if ";" in spec and _EXTRA.search(spec)]
    if not wanted:
        raise RuntimeError(
            "the installed tpu-console declares no `trainer` extra; reinstall it from the checkout"
        )
    out = []
    for spec in wanted:
        name = re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0]
        if name == "jax" and jax == "tpu":
            spec = "jax[tpu]" + spec[len(name) :]
        out.append(spec)
    names = {re.split(r"[<>=!~\[ ]", spec, maxsplit=1)[0] for spec in out}
    return sorted(out) + [spec for spec in _ALSO_NEEDED if re.split(r"[<>=]", spec)[0] not in names]


def environment_digest(requirements: list[str], python: str, link: str | None) -> str:
    """Equal digests mean a worker's environment already holds what this bootstrap would install."""
    text = json.dumps({"requirements": requirements, "python": python, "link": link}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
