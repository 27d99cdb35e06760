"""What launch ships into a run's folder (launch/start.py) holds every worker module that a shipped one
imports beside itself (`import step_formats` in step_lines.py): one left out would be missed only on a worker,
where the import fails or falls back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tpu_console import worker
from tpu_console.fleet import run_recipes
from tpu_console.launch import start


def shipped_into_run_folder() -> set[str]:
    """The worker files `launch` uploads into the run folder, read from its `fleet.put` calls (and its loop
    over the supervisor's modules)."""
    text = Path(start.__file__).read_text()
    uploads = re.findall(r'fleet\.put\(run_recipes\.(\w+_SOURCE), f"\{folder\}/\{(\w+)\}"', text)
    files = set()
    if "in run_recipes.SUPERVISOR_MODULE_SOURCES.items():" in text:
        for name, shipped in run_recipes.SUPERVISOR_MODULE_SOURCES.items():
            assert shipped == worker.source(name), f"SUPERVISOR_MODULE_SOURCES[{name!r}] is not its bytes"
            files.add(name)
    for source_name, file_name in uploads:
        file = getattr(start, file_name)
        shipped = getattr(run_recipes, source_name)
        assert shipped == worker.source(file), f"{source_name} is not {file}'s bytes"
        files.add(file)
    return files


def sibling_imports(file: str) -> set[str]:
    """The worker modules `file` imports by their bare name, as it finds them in the run folder."""
    found = set()
    for node in ast.walk(ast.parse(worker.source(file))):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level
                 else [])
        found |= {f"{name}.py" for name in names if (worker.HERE / f"{name}.py").exists()}
    return found


def test_every_worker_module_a_shipped_file_imports_is_shipped_with_it():
    shipped = shipped_into_run_folder()
    assert {"job_runner.py", "supervisor.py", "step_lines.py"} <= shipped  # the uploads were read
    missing = sorted(f"{imported} (imported by {file})" for file in shipped
                     for imported in sibling_imports(file) - shipped)
    assert missing == [], f"launch/start.py does not ship these into the run folder: {missing}"


def test_the_step_line_formats_are_read_beside_the_step_lines():
    assert "step_formats.py" in sibling_imports("step_lines.py")
