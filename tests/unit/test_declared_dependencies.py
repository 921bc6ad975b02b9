"""Every third-party module labkit imports is declared: in pyproject.toml's dependencies (or an extra, for the
optional ones), and pinned in requirements.txt. A module that only arrives as another package's dependency (as
scikit-learn did, through mlflow) breaks `pip install labkit` the day that package stops pulling it in."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "labkit"


def _imported() -> dict[str, str]:
    """{top-level module: a file that imports it} for every absolute import in the package."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return found


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(specs: list[str]) -> set[str]:
    return {_norm(re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0]) for spec in specs}


def test_every_imported_library_is_declared_and_pinned() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = _names(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        declared |= _names(extra)
    pinned = _names([line for line in (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
                     if line.strip() and not line.startswith("#")])
    owners = packages_distributions()
    missing, unpinned = [], []
    for module, where in sorted(_imported().items()):
        if module == "labkit" or module in sys.stdlib_module_names or module not in owners:
            continue  # the package itself, the standard library, or a module no installed distribution provides
        dists = {_norm(d) for d in owners[module]}
        if not dists & declared:
            missing.append(f"{module} ({'/'.join(sorted(dists))}, imported by {where})")
        elif not dists & (pinned | {"deepspeed", "mlflow", "tensorboard", "bitsandbytes", "jupyterlab"}):
            unpinned.append(module)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert not unpinned, f"declared but not pinned in requirements.txt: {unpinned}"


def test_scikit_learn_is_declared_for_the_kappa_of_the_ratings() -> None:
    source = (PACKAGE / "evaluate" / "human.py").read_text(encoding="utf-8")
    assert "from sklearn.metrics import cohen_kappa_score" in source  # the library, not a hand-written kappa
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "scikit-learn" in _names(project["dependencies"])
