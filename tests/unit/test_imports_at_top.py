"""Library modules import what they use at the top; the command line (`labkit/cli`) is the one place where imports
are late (each command imports its implementation inside its function: tests/unit/cli/test_fast_start.py).

An import inside a function, or a class defined inside a function, anywhere else in the package fails here unless
`ALLOWED` names it with its reason, so laziness cannot creep back.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1].parent / "labkit"
BOUNDARY = "labkit.cli"  # the command line: late imports are its job
# (module, imported module) -> why it is imported inside a function
ALLOWED = {
    ("labkit.card.experiment_and_data", "jsonschema"): "jsonschema takes ~2 s to import (its URI grammar): only "
                                                       "cards with a drop_target_failing_schema rule pay it, not every "
                                                       "card load",
    ("labkit.data.sources", "jsonschema"): "the same ~2 s, paid by every stage kernel that prepares data: only a "
                                           "drop_target_failing_schema rule validates targets",
    ("labkit.data.prompting", "trl.trainer.sft_trainer"): "trl's SFT module loads peft, bitsandbytes and accelerate "
                                                           "(seconds; bitsandbytes logs as it loads): only a tokenizer "
                                                           "whose pad is its EOS needs its collator",
    ("labkit.experiment.tracking_mlflow", "mlflow.tracking"): "mlflow is optional (the `track` extra): only a card "
                                                              "with tracking.mlflow needs it",
    ("labkit.experiment.tracking_mlflow", "mlflow.entities"): "mlflow is optional (the `track` extra)",
    ("labkit.scoring.rouge", "rouge_score"): "rouge_score imports nltk (0.6-1 s), which every stage kernel would pay "
                                             "through the trainer's early stopping: only a card scoring ROUGE needs it",
    ("labkit.stages.context", "labkit.preflight.sizing"): "the method check applies the card's method on the meta "
                                                          "device (peft with bitsandbytes: seconds): only a notebook "
                                                          "that starts a new run checks it, not every stage 01 and 02 "
                                                          "kernel start (tests/unit/cli/test_fast_start.py)",
    ("labkit.experiment.tracking_wandb", "wandb"): "wandb is optional (the `track` extra): only a card with "
                                                   "tracking.wandb needs it (and it takes seconds to import)",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def late(source: str) -> list[tuple[int, str]]:
    """The imports and classes inside functions of a module's source, as (line, imported module or "class NAME").

    Args:
        source: a module's source text.
    Returns:
        one entry per import statement or class definition found inside a function (at any depth).
    """
    found: list[tuple[int, str]] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if in_function and isinstance(child, ast.Import):
                found.extend((child.lineno, a.name) for a in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                found.append((child.lineno, "." * child.level + (child.module or "")))
            elif in_function and isinstance(child, ast.ClassDef):
                found.append((child.lineno, f"class {child.name}"))
            walk(child, inside)

    walk(ast.parse(source), False)
    return found


def _scanned() -> dict[str, Path]:
    modules = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    return {name: path for name, path in modules.items()
            if not name.startswith(BOUNDARY + ".")}


def test_library_modules_import_at_the_top() -> None:
    modules = _scanned()
    assert len(modules) > 50 and "labkit.model.loading" in modules and "labkit.cli.main" not in modules
    assert "labkit.stages.context" in modules and "labkit.preflight.stepchecks" in modules
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}" for name, path in modules.items()
             for line, what in late(path.read_text(encoding="utf-8")) if (name, what) not in ALLOWED]
    assert not found, "import at the top of the module (or add to ALLOWED with the reason):\n" + "\n".join(found)


def test_every_allowed_late_import_is_still_there() -> None:
    modules = _scanned()
    present = {(name, what) for name, path in modules.items() for _, what in late(path.read_text(encoding="utf-8"))}
    assert set(ALLOWED) <= present, f"stale entries: {sorted(set(ALLOWED) - present)}"


def test_the_scan_finds_an_import_or_a_class_inside_a_function() -> None:
    source = ("import os\n\n\ndef f():\n    if os.sep:\n        import torch\n        from .x import y\n"
              "    class Cb:\n        pass\n\n\nclass Top:\n    def m(self):\n        import json\n")
    assert late(source) == [(6, "torch"), (7, ".x"), (8, "class Cb"), (14, "json")]
    assert late("import torch\n\n\nclass A:\n    x = 1\n") == []
