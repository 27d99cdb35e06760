"""Which workers a command goes to: `all`, `0`, `0,2`, `1-3`, or a mix such as `0,2-3`."""

from __future__ import annotations

from tpu_console.errors import UserError


def parse_worker_selection(text: str, worker_count: int) -> list[int]:
    """Return the selected worker indices, sorted and without repeats.

    Raises UserError naming the valid range when `text` is malformed or names a worker the node lacks,
    so a typo never silently runs on the wrong hosts.
    """
    valid = _valid_range(worker_count)
    spec = text.strip().lower()
    if spec == "all":
        return list(range(worker_count))
    if not spec:
        raise UserError(
            f"empty worker selection; use all, an index ({valid}), a list like 0,2 or a range like 1-3"
        )
    selected: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        first, sep, last = part.partition("-")
        try:
            start = int(first)
            stop = int(last) if sep else start
        except ValueError:
            raise UserError(
                f"bad worker selection {text!r}: use all, an index ({valid}), a list like 0,2 or a range "
                "like 1-3"
            ) from None
        if start < 0 or stop < 0:
            raise UserError(f"bad worker selection {text!r}: worker indices are {valid}")
        if stop < start:
            raise UserError(
                f"bad worker range {part!r} in {text!r}: write the lower index first, e.g. {stop}-{start}"
            )
        if stop >= worker_count:
            raise UserError(
                f"worker {stop} is out of range: this node has {worker_count} "
                f"worker{'s' if worker_count != 1 else ''} ({valid})"
            )
        selected.update(range(start, stop + 1))
    return sorted(selected)


def _valid_range(worker_count: int) -> str:
    return "0" if worker_count == 1 else f"0-{worker_count - 1}"
