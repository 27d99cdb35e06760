"""The console's layers hold (docs/architecture.md): read from every module's imports (those inside functions
included), each module sits in one layer and imports only from its own layer or the ones below it, no modules
import each other in a ring, `worker/` is the standard library only and reached only by the code that ships
it, the trainer never imports the console, and the console imports only the trainer's JAX-free modules."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top to bottom; a module belongs to the first layer with a prefix of its name. Keep in step with
# docs/architecture.md.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "tui | cli",
        (
            "tpu_console.cli",
            "tpu_console.__main__",
            "tpu_console.tui",
        ),
    ),
    ("views", ("tpu_console.views",)),
    ("experiments", ("tpu_console.experiments",)),
    ("controller", ("tpu_console.controller",)),
    ("doctor", ("tpu_console.doctor",)),
    ("launch", ("tpu_console.launch",)),
    ("observe", ("tpu_console.observe",)),
    ("history", ("tpu_console.history",)),
    ("provision", ("tpu_console.provision",)),
    ("fleet", ("tpu_console.fleet",)),
    ("providers", ("tpu_console.providers",)),
    (
        "domain",
        (
            "tpu_console.domain",
            "tpu_console.errors",
            "tpu_console.locations",
            "tpu_console.settings",
            "tpu_console.secrets",
            "tpu_console.pricing",
            "tpu_console.ssh_identity",
            "tpu_console.asyncssh_tuning",
        ),
    ),
)
PACKAGE_ROOT = "tpu_console"  # `tpu_console/__init__.py`: empty, in no layer
WORKER = "tpu_console.worker"
# The code that ships worker/ to hosts (fleet/, provision/, doctor/) and the local pods' hosts
# (providers/local/).
WORKER_USERS = ("tpu_console.fleet", "tpu_console.provision", "tpu_console.providers.local",
                "tpu_console.doctor")
# The run's record (launch.json's one schema) is read on both sides: any console module may import it.
SHARED_WITH_WORKERS = ("tpu_console.worker.run_record",)
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "transformers", "torch", "numpy")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(package: str) -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / package).rglob("*.py"))}


def imports(path: Path, *, top_level_only: bool = False) -> list[tuple[str, ast.stmt]]:
    """Absolute names of what `path` imports (`from a import b` gives a.b when b is a module, else a),
    with the statement. top_level_only: only the imports directly in the module's body, which run when it is
    imported (not those inside functions or under `if TYPE_CHECKING:`)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                is_module = (ROOT / submodule.replace(".", "/")).with_suffix(".py").exists() or (
                    ROOT / submodule.replace(".", "/") / "__init__.py"
                ).exists()
                found.append((submodule if is_module else source, node))
    return found


def layer_of(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


CONSOLE = modules("tpu_console")
TRAINER = modules("trainer")


def test_every_console_module_sits_in_one_layer_or_in_worker():
    homeless = [m for m in CONSOLE if m != PACKAGE_ROOT and layer_of(m) is None and not m.startswith(WORKER)]
    assert homeless == [], "place these in LAYERS here and in docs/architecture.md"


def test_no_console_module_imports_from_a_layer_above_its_own():
    upward = []
    for module, path in CONSOLE.items():
        here = layer_of(module)
        for target, node in imports(path):
            there = layer_of(target)
            if here is not None and there is not None and there < here:
                upward.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} ({LAYERS[here][0]}) imports {target} "
                    f"({LAYERS[there][0]})"
                )
    assert upward == []


def test_no_console_modules_import_each_other_in_a_ring():
    graph = {m: {t for t, _ in imports(p) if t in CONSOLE and t != m} for m, p in CONSOLE.items()}
    # A package's __init__ importing its own modules is how a package is read, not a ring.
    for module in graph:
        graph[module] = {t for t in graph[module] if not module.startswith(t + ".")}
    rings, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                rings.append(" -> ".join(stack[stack.index(target) :] + [module, target]))
            elif target not in state:
                visit(target, stack + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    assert rings == []


def test_the_ring_finder_finds_a_ring(monkeypatch, tmp_path):
    # The checks above pass on a clean tree; this one shows the ring check can fail.
    package = tmp_path / "tpu_console" / "ring"
    package.mkdir(parents=True)
    (package / "a.py").write_text("from tpu_console.ring import b\n")
    (package / "b.py").write_text("def f():\n    from tpu_console.ring.a import x\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "CONSOLE", modules("tpu_console"))
    with pytest.raises(AssertionError):
        test_no_console_modules_import_each_other_in_a_ring()


def test_worker_code_is_standard_library_python_3_8_and_reached_only_by_what_ships_it():
    worker = {m: p for m, p in CONSOLE.items() if m == WORKER or m.startswith(WORKER + ".")}
    assert worker, "tpu_console/worker/ is gone"
    problems = []
    for path in worker.values():
        source = path.read_text()
        try:
            ast.parse(source, filename=str(path), feature_version=(3, 8))
        except SyntaxError as exc:
            problems.append(f"{path.relative_to(ROOT)}:{exc.lineno}: not Python 3.8: {exc.msg}")
        optional = optional_imports(ast.parse(source))
        for target, node in imports(path):
            top = target.partition(".")[0]
            # a module of worker/ itself: shipped beside the file that imports it
            sibling = target.startswith(WORKER + ".") or (WORKER + "." + target) in worker
            if top not in sys.stdlib_module_names and node.lineno not in optional and not sibling:
                problems.append(
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {target}, not standard library"
                )
    for module, path in CONSOLE.items():
        if module.startswith(WORKER) or module.startswith(WORKER_USERS):
            continue
        problems += [
            f"{path.relative_to(ROOT)}:{node.lineno} imports {target}; only {', '.join(WORKER_USERS)} may"
            for target, node in imports(path)
            if (target == WORKER or target.startswith(WORKER + ".")) and target not in SHARED_WITH_WORKERS
        ]
    assert problems == []


def optional_imports(tree: ast.Module) -> set[int]:
    """Imports in a `try` whose handler catches ImportError: packages a worker may lack, which the program
    names when they are absent (the libtpu probe's grpc and tpu_info)."""
    optional: set[int] = set()  # their line numbers
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
            for h in node.handlers
        ):
            optional |= {n.lineno for n in node.body if isinstance(n, ast.Import | ast.ImportFrom)}
    return optional


def test_the_trainer_never_imports_the_console():
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {target}"
        for path in TRAINER.values()
        for target, node in imports(path)
        if target.partition(".")[0] == "tpu_console"
    ]
    assert found == []


def test_the_console_imports_only_trainer_modules_that_load_without_jax():
    def heavy_closure(module: str, seen: set[str]) -> list[str]:
        if module in seen or module not in TRAINER:
            return []
        seen.add(module)
        parent = module.rpartition(".")[0]
        found = heavy_closure(parent, seen) if parent else []  # importing a.b runs a/__init__.py first
        for target, _ in imports(TRAINER[module], top_level_only=True):
            if target.partition(".")[0] in HEAVY:
                found.append(f"{module} imports {target}")
            found += heavy_closure(target, seen)
        return found

    problems = []
    for path in CONSOLE.values():
        for target, node in imports(path):
            if target.partition(".")[0] == "trainer":
                problems += [
                    f"{path.relative_to(ROOT)}:{node.lineno}: {target}: {why}"
                    for why in heavy_closure(target, set())
                ]
    assert problems == []
