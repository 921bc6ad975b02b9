"""The notebook contract: committed without outputs, purpose first, a `parameters` cell of flat literals, and cells
that call, show and explain: they write no file and assemble no summary (the stage's module in labkit/stages does)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from labkit.core.runs import NOTEBOOKS, STAGES

NB_DIR = Path(__file__).resolve().parents[2] / "notebooks"
STAGES_DIR = Path(__file__).resolve().parents[2] / "labkit" / "stages"

# calls a cell may not make, by the called name: each writes a file, or records the stage (Stage.done, the registry)
WRITERS = {"save_json", "save_jsonl", "save_text", "write_json", "write_jsonl", "write_atomic", "write_text",
           "write_bytes", "dump", "done", "record", "new_run", "save", "save_pretrained", "save_model", "savefig",
           "to_csv", "to_json", "to_parquet", "copyfile", "copy2", "copytree", "move", "rmtree", "unlink", "touch"}
FILE_MODULES = {"os", "shutil"}  # any call on these (os.remove, shutil.copy, …) changes files
MAGICS = {"writefile", "store"}  # %%writefile, %store


def _mode(call: ast.Call, position: int) -> str:
    """The constant mode of an open() call ("r" when it is not given or not a constant)."""
    node = next((k.value for k in call.keywords if k.arg == "mode"), None)
    if node is None and len(call.args) > position:
        node = call.args[position]
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "r"


def cell_writes(source: str) -> list[str]:
    """The calls in a code cell that write a file or record the stage, e.g. ["line 2: stage.save_json"].

    The cell goes through IPython's own transformation first, so `%%writefile` and `!cmd > file` are calls too.
    """
    tree = ast.parse(TransformerManager().transform_cell(source))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, name = node.func, ""
        if isinstance(func, ast.Name):
            name = func.id
        elif isinstance(func, ast.Attribute):
            name = func.attr
        what = ast.unparse(func)
        first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        if (name in WRITERS
                or isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in FILE_MODULES
                or name == "open" and set(_mode(node, 1 if isinstance(func, ast.Name) else 0)) & set("wax+")
                or name in ("run_cell_magic", "run_line_magic") and first in MAGICS
                or name in ("system", "getoutput") and isinstance(first, str) and (">" in first or "tee " in first)):
            found.append(f"line {node.lineno}: {what}")
    return sorted(found, key=lambda f: int(f.split()[1].rstrip(":")))


def notebook_writes(book: nbformat.NotebookNode) -> list[str]:
    """`cell_writes` of every code cell of a notebook, as "cell N, line L: call"."""
    return [f"cell {i}, {hit}" for i, cell in enumerate(book.cells) if cell.cell_type == "code"
            for hit in cell_writes(cell.source)]


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
    # the stage is recorded done: by its module (labkit/stages/<stage>.py), or (stage 03 until merged) in a cell
    code = "".join(c.source for c in cells if c.cell_type == "code")
    assert "stage.done(" in (STAGES_DIR / f"{stage}.py").read_text(encoding="utf-8") + code


@pytest.mark.parametrize("stage", STAGES)
def test_cells_write_no_file_and_assemble_no_summary(stage: str) -> None:
    """Cells call, show and explain; every file of a stage's folder and its summary are its module's, so editing a
    cell cannot break `labkit plan`, `compare` or the budget status."""
    book = nbformat.read(NB_DIR / NOTEBOOKS[stage], as_version=4)
    assert notebook_writes(book) == [], f"{stage}: move these writes into labkit/stages/{stage}.py"


def test_the_write_check_reports_a_cell_that_writes_a_run_file() -> None:
    """The check above can fail: a notebook whose cells write run files and assemble a summary is reported, cell by
    cell, and the cells that only read and show are not."""
    v4 = nbformat.v4
    book = v4.new_notebook(cells=[
        v4.new_markdown_cell("# 03 · Parameter check\n\n**Purpose.** x **Decides:** y"),
        v4.new_code_cell('stage = open_stage("parameter_check", card, run_dir)\nfit = stage.read("parameter_check", '
                         '"fit.json")\nshow.table(fit["plan"])'),
        v4.new_code_cell('fit["plan"]["seconds_per_step"] = 0.1\nstage.save_json("fit.json", fit)'),
        v4.new_code_cell('summary = stage.done(seconds_per_step=fit["plan"]["seconds_per_step"], estimate_error=0.2)'),
        v4.new_code_cell('(stage.out / "memory.json").write_text(json.dumps({}))'),
        v4.new_code_cell('with open(stage.path("notes.json"), "w") as handle:\n    json.dump({"ok": True}, handle)'),
    ])
    assert notebook_writes(book) == ["cell 2, line 2: stage.save_json", "cell 3, line 1: stage.done",
                                     "cell 4, line 1: (stage.out / 'memory.json').write_text",
                                     "cell 5, line 1: open", "cell 5, line 2: json.dump"]


@pytest.mark.parametrize("source, expected", [
    ('io.write_json(run_dir + "/training/summary.json", {"budget_exhausted": False})', "io.write_json"),
    ('stage.save_jsonl("rows.jsonl", rows)', "stage.save_jsonl"),
    ('Path("x.png").write_bytes(data)', "Path('x.png').write_bytes"),
    ('handle = Path(run_dir, "training", "outcome.json").open(mode="w")', "Path(run_dir, 'training', 'outcome.json').open"),
    ('handle = open("a.jsonl", "a")', "open"),
    ('shutil.copyfile(source, target)', "shutil.copyfile"),
    ('os.remove(stage.path("verdict.json"))', "os.remove"),
    ('R.record(stage.run, "stage_done", stage="training")', "R.record"),
    ('%%writefile verdict.json\n{"confirmed": true}', "get_ipython().run_cell_magic"),
    ('!echo {} > outcome.json', "get_ipython().system"),
])
def test_each_kind_of_write_is_reported(source: str, expected: str) -> None:
    assert cell_writes(source) == [f"line 1: {expected}"]


def test_reading_and_showing_are_not_writes() -> None:
    source = """rows = stage.read("baseline", "baseline_predictions.jsonl")
text = open(stage.path("samples.html")).read() + Path("x").open().read() + open("y", mode="r").read()
label = "min_improvement".replace("_", " ")
show.table(json.loads(json.dumps(rows)))
plots.loss_curve(history, stage.path("loss_curve.png"), title="x")
summary = training.finish(stage)"""
    assert cell_writes(source) == []


@pytest.mark.parametrize("stage", STAGES)
def test_committed_without_outputs(stage: str) -> None:
    book = nbformat.read(NB_DIR / NOTEBOOKS[stage], as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{stage}: strip outputs before committing"
        assert "papermill" not in cell.metadata


@pytest.mark.parametrize("stage", STAGES)
def test_every_cell_has_its_own_id(stage: str) -> None:
    """nbformat 4.5 cells carry an id; without one every papermill run warns "Cell is missing an id field"."""
    ids = [cell.get("id") for cell in json.loads((NB_DIR / NOTEBOOKS[stage]).read_text())["cells"]]
    assert None not in ids and len(set(ids)) == len(ids), f"{stage}: cell ids {ids}"


@pytest.mark.parametrize("stage", STAGES)
def test_code_cells_are_short(stage: str) -> None:
    book = nbformat.read(NB_DIR / NOTEBOOKS[stage], as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert len(cell.source.splitlines()) <= 12, "logic belongs in labkit, not in the notebook"
