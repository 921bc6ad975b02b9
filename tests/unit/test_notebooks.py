"""The notebook contract: committed without outputs, purpose first, a `parameters` cell of flat literals."""

from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from labkit.core.runs import NOTEBOOKS, STAGES

NB_DIR = Path(__file__).resolve().parents[2] / "notebooks"


def setup_cell() -> str:
    """The Colab/Kaggle set-up cell (tests/integration/test_wheel.py runs it in a fresh venv)."""
    return nbformat.read(NB_DIR / NOTEBOOKS[STAGES[0]], as_version=4).cells[1].source


def test_setup_cell_needs_no_labkit_and_names_no_placeholder() -> None:
    source = setup_cell()
    tree = ast.parse(source)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"glob", "importlib", "os", "subprocess", "sys"}, imported
    assert "<" not in source and "your-fork" not in source


def test_one_notebook_per_stage() -> None:
    assert sorted(p.name for p in NB_DIR.glob("*.ipynb")) == sorted(NOTEBOOKS.values())


@pytest.mark.parametrize("stage", STAGES)
def test_contract(stage: str) -> None:
    book = nbformat.read(NB_DIR / NOTEBOOKS[stage], as_version=4)
    nbformat.validate(book)
    cells = book.cells
    assert cells[0].cell_type == "markdown" and "Purpose" in cells[0].source and "Decides" in cells[0].source
    assert "Colab / Kaggle" in cells[0].source
    assert cells[1].source == setup_cell(), "the first code cell is the Colab/Kaggle set-up, the same in every notebook"
    params = cells[2]
    assert params.cell_type == "code" and params.metadata.get("tags") == ["parameters"]
    assert sum("parameters" in c.metadata.get("tags", []) for c in cells) == 1
    tree = ast.parse(params.source)
    names = []
    for node in tree.body:
        assert isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant), ast.dump(node)
        names.append(node.targets[0].id)
    assert names == ["card", "run_dir"]
    assert all("# help:" in line for line in params.source.splitlines())
    assert f'open_stage("{stage}", card, run_dir)' in cells[3].source
    assert "stage.done(" in "".join(c.source for c in cells if c.cell_type == "code")


@pytest.mark.parametrize("stage", STAGES)
def test_committed_without_outputs(stage: str) -> None:
    book = nbformat.read(NB_DIR / NOTEBOOKS[stage], as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{stage}: strip outputs before committing"
        assert "papermill" not in cell.metadata


@pytest.mark.parametrize("stage", STAGES)
def test_code_cells_are_short(stage: str) -> None:
    book = nbformat.read(NB_DIR / NOTEBOOKS[stage], as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert len(cell.source.splitlines()) <= 12, "logic belongs in labkit, not in the notebook"
