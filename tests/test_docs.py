"""The docs against the tree.

The code map in docs/architecture.md names every module of `tpu_console/` and `trainer/` and nothing that does
not exist; every relative link in README.md and docs/*.md leads to a file, and every `tests/` path they name
exists. The tests mirror the packages (docs/architecture.md, "The test suite"): each folder of tests/ stands
for a folder of the code, and each snapshot folder for a test module beside it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("tpu_console", "trainer")

_ITEM = re.compile(r"^(?P<indent> *)- (?P<text>.*)$")
_NAMES = re.compile(r"^(?:`[^`]+`(?:, |,? and )?)+")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def code_map_section(text: str) -> str:
    """The lines of the `## Code map` section, up to the next heading of the same level."""
    start = text.index("\n## Code map\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def code_map_paths(section: str) -> list[str]:
    """Every path the code map names, relative to the repository root.

    The map is a nested list; an item begins with the names it maps (in backticks, separated by commas), then
    a colon and what they are. A name ending in `/` is a folder; the items indented under it are inside it.
    Lines that are not list items continue the item above and name nothing.
    """
    items: list[tuple[int, str]] = []  # (indent, text with its continuation lines joined)
    for line in section.splitlines():
        item = _ITEM.match(line)
        if item:
            items.append((len(item["indent"]), item["text"]))
        elif items and line.strip():
            items[-1] = (items[-1][0], items[-1][1] + " " + line.strip())
    paths: list[str] = []
    folders: list[tuple[int, str]] = []  # (indent, folder path) of the open items
    for indent, text in items:
        while folders and folders[-1][0] >= indent:
            folders.pop()
        parent = folders[-1][1] if folders else ""
        head = _NAMES.match(text)
        names = re.findall(r"`([^`]+)`", head.group(0)) if head else []
        # names in the description after the colon, when the head is a folder: `screens/`: `a.py`, `b.py`
        rest = text[head.end() :] if head else text
        if len(names) == 1 and names[0].endswith("/") and rest.startswith(": `"):
            inner = _NAMES.match(rest[2:])
            if inner:
                paths += [parent + names[0] + n for n in re.findall(r"`([^`]+)`", inner.group(0))]
        paths += [parent + n for n in names]
        if len(names) == 1 and names[0].endswith("/"):
            folders.append((indent, parent + names[0]))
    return paths


def package_modules() -> set[str]:
    """Every module of the packages (an `__init__.py` only when it holds code), and the worker's scripts."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            if path.name == "__init__.py" and not _has_code(path):
                continue
            found.add(path.relative_to(ROOT).as_posix())
    for path in (ROOT / "tpu_console" / "worker").glob("*.sh"):
        found.add(path.relative_to(ROOT).as_posix())
    return found


def _has_code(path: Path) -> bool:
    """An `__init__.py` with more than a docstring and imports is a module a reader needs to find."""
    tree = ast.parse(path.read_text())
    return any(
        not isinstance(node, (ast.Import, ast.ImportFrom))
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        and not (isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"])
        for node in tree.body
    )


def test_code_map_names_only_what_exists():
    paths = code_map_paths(code_map_section(ARCHITECTURE.read_text()))
    assert len(paths) > 50, "the code map in docs/architecture.md was not read: is it still a nested list?"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md's code map names what does not exist: {missing}"


def test_code_map_names_every_module():
    named = set(code_map_paths(code_map_section(ARCHITECTURE.read_text())))
    unnamed = sorted(package_modules() - named)
    assert not unnamed, f"modules missing from docs/architecture.md's code map (add them there): {unnamed}"


def test_code_map_parser_nests_folders():
    section = "\n## Code map\n\n- `pkg/`: a\n  - `a.py`,\n    `b.py`: x\n    and more\n"
    section += "  - `sub/`: `c.py`\n- `d.py`: y\n"
    assert code_map_paths(section) == ["pkg/", "pkg/a.py", "pkg/b.py", "pkg/sub/c.py", "pkg/sub/", "d.py"]


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links that point into the repository (no scheme, no bare #anchor)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    links = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        links.append(target)
    return links


def test_relative_links_lead_to_files():
    broken = []
    for md in markdown_files():
        for target in relative_links(md.read_text()):
            path = target.split("#", 1)[0]
            if not (md.parent / path).exists():
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


README_LIMIT = 12 * 1024  # bytes: the README is a front door; detail lives on the page that owns it


def test_readme_is_a_front_door():
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes, over {README_LIMIT}: move detail to a docs page"


def test_relative_links_are_found():
    text = "see [a](docs/a.md#x), [b](https://x.org), [c](#here), ![img](p.png)\n```\n[d](nope.md)\n```\n"
    assert relative_links(text) == ["docs/a.md#x"]


_TESTS_PATH = re.compile(r"(?<![\w/.])tests/[\w/.-]*[\w/]")


def test_tests_the_docs_name_exist():
    named = [
        (path.relative_to(ROOT).as_posix(), found)
        for path in [*markdown_files(), *(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))]
        for found in _TESTS_PATH.findall(path.read_text())
    ]
    assert len(named) > 10, "no tests/ path found in the docs: did the pattern break?"
    missing = sorted({f"{where}: {found}" for where, found in named if not (ROOT / found).exists()})
    assert not missing, f"tests/ paths named in the docs that do not exist (a test module moved?): {missing}"


# A folder of tests/ and the folder of the code it mirrors.
MIRRORS = {"tests/console": "tpu_console", "tests/trainer": "trainer", "tests/benchmarks": "benchmarks"}
# Checks of the whole project, at the top of tests/.
ROOT_TESTS = {"test_docs.py", "test_layers.py", "test_ci.py"}


def test_test_suite_layout_names_only_what_exists():
    text = ARCHITECTURE.read_text()
    start = text.index("\n## The test suite\n")
    end = text.find("\n## ", start + 1)
    paths = code_map_paths(text[start : end if end != -1 else len(text)])
    assert len(paths) > 20, "docs/architecture.md's test suite layout was not read: still a nested list?"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md's test suite layout names what does not exist: {missing}"


def test_tests_mirror_the_packages():
    tests = ROOT / "tests"
    problems = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = folder.relative_to(ROOT).as_posix()
        if "__pycache__" in folder.parts or "__snapshots__" in folder.parts:
            continue
        if not any(folder.rglob("*.py")):
            continue  # data its tests read (recorded program outputs), beside them
        if not (folder / "__init__.py").exists():
            problems.append(f"{rel} has no __init__.py (tests/ is a package)")
        top = next((t for t in MIRRORS if rel == t or rel.startswith(t + "/")), None)
        if top is None:
            problems.append(f"{rel} mirrors no folder of the code (expected under one of {sorted(MIRRORS)})")
        elif not (ROOT / (MIRRORS[top] + rel[len(top) :])).is_dir():
            problems.append(f"{rel} mirrors {MIRRORS[top] + rel[len(top):]}, which does not exist")
    for module in sorted(tests.glob("test_*.py")):
        if module.name not in ROOT_TESTS:
            problems.append(f"tests/{module.name} belongs in the folder that mirrors its code")
    assert not problems, problems


def test_snapshots_sit_beside_their_test_module():
    stale = [
        folder.relative_to(ROOT).as_posix()
        for folder in sorted((ROOT / "tests").rglob("__snapshots__/*"))
        if folder.is_dir() and not (folder.parent.parent / f"{folder.name}.py").exists()
    ]
    assert not stale, f"snapshot folders whose test module is not beside them (move them with it): {stale}"
