"""The package layout holds: layers import only downwards, no import cycles, one entry point, one error type; the
notebooks import only stages, show and the layers below (each exception named with its reason).

The layers, bottom to top (docs/architecture.md explains each):
errors < scoring < card < core < data < model < evaluate < train < preflight < show < stages < experiment < export < cli
< api

The graph is read from the package itself (a wrong PACKAGE path is an error, not an empty graph that passes), follows
relative imports and imports inside functions, and must hold known edges.
"""

from __future__ import annotations

import ast
import json
from collections import defaultdict
from pathlib import Path

import pytest
from conftest import top_level_names

PACKAGE = Path(__file__).resolve().parents[2] / "labkit"
NOTEBOOKS = PACKAGE.parent / "notebooks"
LAYERS = ("errors", "scoring", "card", "core", "data", "model", "evaluate", "train", "preflight", "show", "stages",
          "experiment", "export", "cli", "api")
MAX_LINES = 350
# edges that exist as long as the layout is the one docs/architecture.md describes: an import graph without them was
# not read from this package
KNOWN_EDGES = (("labkit.cli.main", "labkit.errors"), ("labkit.stages.context", "labkit.card.load"))
# notebooks import labkit.show, labkit.stages and the layers below stages (what a stage module may import itself);
# beyond that, only these, each with its reason
NOTEBOOK_EXCEPTIONS = {
    ("05_comparison.ipynb", "labkit.experiment.compare"):
        "stage 05 shows this run next to every variant of its experiment; labkit.experiment reads all the experiment's "
        "runs and sits above stages (a stage module may not import it), so the notebook calls it itself",
}


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package, {dotted name: file}; a path that holds no package is an error, not an empty map."""
    found = {_module_name(p, package): p for p in sorted(package.rglob("*.py"))}
    if not (package / "__init__.py").is_file() or not found:
        raise FileNotFoundError(f"{package}: not a Python package (no __init__.py, no modules): fix PACKAGE")
    return found


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of a relative import (`from ..core import io` in labkit.card.load → labkit.core)."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join(base + ([name] if name else []))


def _imported(tree: ast.AST, module: str = "", is_package: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in a tree, at module level or inside functions; relative imports are
    made absolute against `module`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node.level, node.module) if node.level else node.module or ""
            found.append((node.lineno, target, [a.name for a in node.names]))
    return found


def _imports(path: Path, known: set[str], package: Path = PACKAGE) -> list[tuple[int, str]]:
    """Every labkit module a file imports (at module level or inside functions, relative imports followed), as
    (line, module)."""
    module = _module_name(path, package)
    found = []
    for line, target, names in _imported(ast.parse(path.read_text(encoding="utf-8")), module, path.stem == "__init__"):
        for name in [target] + [f"{target}.{n}" for n in names]:
            if name in known:
                found.append((line, name))
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(package)
    known = set(modules)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for _, target in _imports(path, known, package):
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


# ------------------------------------------------------------------ the test reads the real package
def test_the_module_list_is_this_package() -> None:
    modules = _modules()
    assert len(modules) > 50 and {"labkit", "labkit.cli.main", "labkit.card.load", "labkit.stages.context"} <= set(modules)
    assert {_layer(m) for m in modules} >= set(LAYERS)  # every layer has modules


def test_the_import_graph_has_the_known_edges() -> None:
    graph = _graph()
    missing = [f"{a} → {b}" for a, b in KNOWN_EDGES if b not in graph.get(a, set())]
    assert not missing, f"edges not found in the import graph: {missing}"


def test_a_wrong_package_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a Python package"):
        _modules(tmp_path / "labkit")
    (tmp_path / "labkit").mkdir()
    with pytest.raises(FileNotFoundError, match="fix PACKAGE"):
        _graph(tmp_path / "labkit")


def test_relative_imports_are_followed(tmp_path: Path) -> None:
    package = tmp_path / "labkit"
    for name, text in {"__init__.py": "from . import errors\n", "errors.py": "",
                       "core/__init__.py": "from .io import x\n", "core/io.py": "x = 1\n",
                       "card/__init__.py": "", "card/load.py": "from ..core import io\nfrom . import schema\n",
                       "card/schema.py": "def f():\n    from ..cli import main\n",
                       "cli/__init__.py": "", "cli/main.py": "from labkit.card.load import x\n"}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    graph = _graph(package)
    assert graph["labkit"] == {"labkit.errors"} and graph["labkit.core"] == {"labkit.core.io"}
    assert graph["labkit.card.load"] == {"labkit.core", "labkit.core.io", "labkit.card.schema"}
    assert graph["labkit.card.schema"] == {"labkit.cli", "labkit.cli.main"}  # an upward import inside a function
    assert _cycles(graph) == [["labkit.card.load", "labkit.card.schema", "labkit.cli.main"]]


# ------------------------------------------------------------------ notebooks
def _notebook_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(cell, module, names) of every labkit import in a notebook's code cells."""
    found = []
    for number, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        code = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        found += [(number, m, names) for _, m, names in _imported(ast.parse(code)) if m.split(".")[0] == "labkit"]
    return found


def _notebook_problems(notebook: Path, modules: dict[str, Path]) -> tuple[list[str], set[tuple[str, str]]]:
    """What a notebook imports that it may not (or that does not exist), and the exceptions it used."""
    problems, used = [], set()
    allowed = set(LAYERS[: LAYERS.index("stages") + 1])
    for cell, module, names in _notebook_imports(notebook):
        if module not in modules:
            problems.append(f"{notebook.name} cell {cell}: {module}: no such module")
            continue
        submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]  # from labkit.show import plots
        missing = [n for n in names if f"{module}.{n}" not in modules and n not in top_level_names(modules[module])]
        if missing:
            problems.append(f"{notebook.name} cell {cell}: {module}: defines no {', '.join(missing)}")
        for target in submodules if names and len(submodules) == len(names) else [module]:
            if (notebook.name, target) in NOTEBOOK_EXCEPTIONS:
                used.add((notebook.name, target))
            elif _layer(target) not in allowed:
                problems.append(f"{notebook.name} cell {cell}: {target}: layer {_layer(target)} is above stages "
                                "(notebooks call stages and show)")
    return problems, used


def test_notebooks_import_stages_show_and_the_layers_below() -> None:
    modules = _modules()
    notebooks = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert len(notebooks) == 5
    problems, used = [], set()
    for notebook in notebooks:
        found, exceptions = _notebook_problems(notebook, modules)
        problems += found
        used |= exceptions
        assert any(m == "labkit.stages.context" for _, m, _ in _notebook_imports(notebook)), notebook.name
    assert not problems, "notebook imports:\n" + "\n".join(problems)
    assert used == set(NOTEBOOK_EXCEPTIONS), f"exceptions no notebook needs any more: {set(NOTEBOOK_EXCEPTIONS) - used}"


def test_the_notebook_check_can_fail(tmp_path: Path) -> None:
    cells = [{"cell_type": "code", "source": ["%matplotlib inline\n", "from labkit.cli import runner\n"]},
             {"cell_type": "code", "source": "from labkit.stages.context import open_stage, no_such_name\n"},
             {"cell_type": "markdown", "source": "from labkit.export import deliver"},
             {"cell_type": "code", "source": "import labkit.nowhere\nfrom labkit.experiment.compare import summary_rows"}]
    notebook = tmp_path / "05_comparison.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    problems, used = _notebook_problems(notebook, _modules())
    assert [p.split(": ", 1)[1] for p in problems] == [
        "labkit.cli.runner: layer cli is above stages (notebooks call stages and show)",
        "labkit.stages.context: defines no no_such_name", "labkit.nowhere: no such module"]
    assert used == {("05_comparison.ipynb", "labkit.experiment.compare")}
