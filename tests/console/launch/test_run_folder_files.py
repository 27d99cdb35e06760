"""What launch ships into a run's folder (fleet/run_recipes.py's tables, uploaded by launch/start.py) holds
every worker module that a shipped one imports beside itself (`import step_formats` in step_lines.py), on the
first worker and on the others: one left out would be missed only on a worker, where the import fails or
falls back. That launch uploads the tables is held by test_launch_command.py, which lists a run's folders."""

from __future__ import annotations

import ast

import pytest

from tpu_console import worker
from tpu_console.fleet import run_recipes


def shipped_into_run_folder(first_worker: bool = True) -> set[str]:
    """The worker files `launch` uploads into a worker's run folder (fleet/run_recipes.py's tables: the
    runner's on every worker, the supervisor's beside them on the first)."""
    return set(run_recipes.RUNNER_MODULES) | (set(run_recipes.SUPERVISOR_MODULES) if first_worker else set())


def sibling_imports(file: str) -> set[str]:
    """The worker modules `file` imports by their bare name, as it finds them in the run folder."""
    found = set()
    for node in ast.walk(ast.parse(worker.source(file))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                 else [])
        found |= {f"{name}.py" for name in names if (worker.HERE / f"{name}.py").exists()}
    return found


@pytest.mark.parametrize("first_worker", [True, False], ids=["the first worker", "the others"])
def test_every_worker_module_a_shipped_file_imports_is_shipped_with_it(first_worker):
    shipped = shipped_into_run_folder(first_worker)
    missing = sorted(f"{imported} (imported by {file})" for file in shipped
                     for imported in sibling_imports(file) - shipped)
    assert missing == [], f"fleet/run_recipes.py does not ship these into the run folder: {missing}"


def test_what_is_shipped_is_each_files_own_bytes():
    for sources in (run_recipes.RUNNER_MODULE_SOURCES, run_recipes.SUPERVISOR_MODULE_SOURCES):
        assert all(source == worker.source(name) for name, source in sources.items())


def test_the_step_line_formats_are_read_beside_the_step_lines():
    assert "step_formats.py" in sibling_imports("step_lines.py")
