"""Remapping the app's keys: every binding has an id (`nodes.create`, `runs.compare`, `run.follow` ...), and
`[keys]` in config.toml maps ids to other keys. An id that names no binding is refused, naming the ids."""

from __future__ import annotations

import importlib
import pkgutil

from textual.binding import Binding
from textual.dom import DOMNode

from tpu_console.errors import UserError


def known_binding_ids() -> set[str]:
    """The ids of every binding of every screen, modal and widget of the app."""
    from tpu_console import tui

    ids: set[str] = set()
    for info in pkgutil.walk_packages(tui.__path__, f"{tui.__name__}."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, DOMNode) and value.__module__ == module.__name__:
                ids.update(b.id for b in value.BINDINGS if isinstance(b, Binding) and b.id)
    return ids


def check_keymap(keymap: dict[str, str]) -> dict[str, str]:
    """The keymap, once every id in it is known and every key is given; else a UserError naming the fix."""
    known = known_binding_ids()
    for binding_id, keys in keymap.items():
        if binding_id not in known:
            raise UserError(
                f"[keys] {binding_id!r} is not a binding id; use one of: {', '.join(sorted(known))}"
            )
        if not keys.strip():
            raise UserError(f'[keys] {binding_id!r} has no key; give one, e.g. {binding_id!r} = "f5"')
    return keymap
