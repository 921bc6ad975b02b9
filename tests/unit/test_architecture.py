"""The package layout holds: layers import only downwards, no import cycles, one entry point, one error type.

The layers, bottom to top (docs/architecture.md explains each):
errors < scoring < card < core < data < model < evaluate < train < preflight < show < stages < experiment < export < cli
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "labkit"
LAYERS = ("errors", "scoring", "card", "core", "data", "model", "evaluate", "train", "preflight", "show", "stages",
          "experiment", "export", "cli")
MAX_LINES = 350


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path, known: set[str]) -> list[tuple[int, str]]:
    """Every labkit module a file imports (at module level or inside functions), as (line, module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name.startswith("labkit.") and name in known:
                found.append((node.lineno, name))
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for _, target in _imports(path, known):
            if target != name and not name.startswith(target + "."):  # a package's own __init__ is no edge
                graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    stray = [m for m in _modules() if m not in {"labkit", "labkit.__main__"} and _layer(m) not in LAYERS]
    assert not stray, f"modules outside the layers {LAYERS}: {stray}"


def test_packages_import_only_from_layers_below() -> None:
    modules = _modules()
    upward = []
    for name, path in modules.items():
        mine = _layer(name)
        if mine not in LAYERS:
            continue
        for line, target in _imports(path, set(modules)):
            theirs = _layer(target)
            if theirs in LAYERS and LAYERS.index(theirs) > LAYERS.index(mine):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} ({mine} < {theirs})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_no_import_cycles_between_modules_or_packages() -> None:
    graph = _graph()
    assert _cycles(graph) == []
    packages: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        for target in targets:
            if _layer(source) != _layer(target) and _layer(source) and _layer(target):
                packages[_layer(source)].add(_layer(target))
    assert _cycles(packages) == []


def test_the_cycle_check_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_stages_mirror_the_notebooks() -> None:
    notebooks = sorted(p.stem.split("_", 1)[1] for p in (PACKAGE.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    shared = {"__init__", "context", "records", "run_metrics"}  # what every stage opens, names, or reads back
    stages = sorted(p.stem for p in (PACKAGE / "stages").glob("*.py") if p.stem not in shared)
    assert notebooks == stages


def test_one_entry_point_and_modules_of_reasonable_size() -> None:
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        mains = [n.lineno for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        if _layer(name) != "cli":
            assert not mains, f"{path}:{mains[0]}: main() outside labkit/cli"
        assert len(text.splitlines()) <= MAX_LINES, f"{path}: {len(text.splitlines())} lines (split it by concern)"


@pytest.mark.parametrize("base", ["Exception", "ValueError", "RuntimeError", "KeyError", "OSError",
                                  "FileNotFoundError", "PermissionError"])
def test_error_classes_derive_from_labkit_error(base: str) -> None:
    """Every exception class labkit defines lives in labkit.errors and derives from LabkitError."""
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == base for b in node.bases):
                where = f"{path}:{node.lineno}: {node.name} derives from {base}"
                assert name == "labkit.errors", f"{where} outside labkit/errors.py"
                assert base != "Exception" or node.name == "LabkitError", f"{where}, not from LabkitError"
