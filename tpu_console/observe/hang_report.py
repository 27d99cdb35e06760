"""A hang made readable: from every worker's stacks (observe/stacks.py), where the workers wait and which
never reached that place. Pure.

The place the others wait in is the largest group of workers whose stacks are the same and stand in a
collective (a frame named like one: psum, all_reduce, all_gather, ppermute, barrier, block_until_ready ...),
else the largest group; every other group, and every worker whose job did not answer, never reached it:

    workers 0,2,3 wait in a collective at train.py:12 (all_reduce); worker 1 never reached it: at
    train.py:20 (load_batch)
"""

from __future__ import annotations

import re

from tpu_console.observe.stacks import RunStacks, StackGroup

COLLECTIVE_WORDS = ("psum", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
                    "ppermute", "all_to_all", "collective", "barrier", "block_until_ready",
                    "sync_global_devices", "process_allgather", "broadcast_one_to_all")
# a frame of faulthandler's dump (py-spy's is turned into it): `  File "x.py", line 12 in all_reduce`
_FUNCTION = re.compile(r'^\s+File "[^"]+", line \d+ in (?P<func>.+)$')


def in_collective(stack_group: StackGroup) -> bool:
    """Whether any frame of the group's stacks is named like a collective (or a wait for one)."""
    names = [m["func"].lower() for line in stack_group.stack.splitlines() if (m := _FUNCTION.match(line))]
    return any(word in name for name in names for word in COLLECTIVE_WORDS)


def hang_line(found: RunStacks) -> str | None:
    """One line: who waits where, and who never reached it; None when no worker's job answered or stands
    apart (nothing to tell from the stacks)."""
    if not found.groups:
        return None
    if len(found.groups) == 1 and not found.silent:
        only = found.groups[0]
        return f"every worker at {only.where}" + (" (in a collective)" if in_collective(only) else "")
    collective = [g for g in found.groups if in_collective(g)]
    waiting = (collective or found.groups)[0]  # groups come largest first
    place = "in a collective at" if waiting in collective else "at"
    parts = [f"{_who(found, waiting)} wait {place} {waiting.where}"]
    for other in found.groups:
        if other is not waiting:
            parts.append(f"{_who(found, other)} never reached it: at {other.where}")
    for worker, why in sorted(found.silent.items()):
        parts.append(f"worker {worker} never reached it: did not answer ({why})")
    return "; ".join(parts)


def _who(found: RunStacks, stack_group: StackGroup) -> str:
    workers = stack_group.workers
    if found.slice_of:
        return found.who(stack_group)
    return f"worker {workers[0]}" if len(workers) == 1 else f"workers {','.join(map(str, sorted(workers)))}"
