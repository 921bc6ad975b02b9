"""The experiment's report is a folder meant for sharing: no machine path in any of its files (the project's, /tmp,
the home folder, Python's prefix, the repository), its runs table cut to fit a page without breaking words, the card
diff of a variant that inherits a relative data path empty of false changes, and the human verdict of two variants
rated blind named by their runs. Runs made by labkit's own `new_run` and filled with scored rows (no model), one
executed notebook page per run as papermill leaves it (parameters with absolute paths, a traceback)."""

from __future__ import annotations

import json
import random
import re
import sys
import tempfile
from pathlib import Path

import nbformat
import yaml
from conftest import REPO

from labkit.card.load import load_card
from labkit.core import io
from labkit.core import runs as R
from labkit.experiment.report import STYLE, build_report
from labkit.experiment.runs_table import COST_COLUMNS, DECISION_COLUMNS
from labkit.scoring.metrics import score_predictions
from labkit.show.widgets import ABRating

CATEGORIES = ("billing", "technical", "account")
# an absolute path under a machine's top-level folders, where a path starts (not inside a URL or a word)
ABSOLUTE = re.compile(r"(?<![\w.~$/:,=+-])/(?:home|Users|root|tmp|var|private|mnt|srv|data|opt|work|usr|etc)/")


def _answer(i: int, right: bool) -> str:
    return json.dumps({"category": CATEGORIES[i % 3], "priority": "low" if right else "high", "product": "x"})


def _finish(run: R.Run, loaded, p_right: float, seed: int) -> None:
    """What stages 01 and 05 leave for the comparison, then an executed notebook as papermill archives it."""
    fmt = loaded.card.data.target_format.model_dump()
    for folder, name, p, rng in (("baseline", "baseline", 0.1, 0), ("comparison", "tuned", p_right, seed)):
        r = random.Random(rng)
        rows = [{"id": f"t{i:03d}", "category": CATEGORIES[i % 3], "input": f"ticket {i}", "target": _answer(i, True),
                 "prediction": _answer(i, r.random() < p)} for i in range(30)]
        scored, metrics = score_predictions(rows, fmt)
        io.write_jsonl(run.stage_dir(folder) / f"{name}_predictions.jsonl", scored)
        io.write_json(run.dir / folder / f"{name}_metrics.json", metrics)
    io.write_json(run.dir / "baseline" / "baseline_key.json", {"key": "k1"})
    io.write_json(run.dir / "comparison" / "verdict.json", {"confirmed": False})
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(f'card = "{loaded.path}"\nrun_dir = "{run.dir}"')
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=(
        f"{sys.prefix}/lib/python3/site-packages/transformers/x.py:12: UserWarning: cache at {Path.home()}/.cache/x\n"
        f"reading {run.dir}/baseline/baseline_predictions.jsonl from {tempfile.gettempdir()}/x and /home/ana/t.jsonl\n"))]
    nb.cells = [nbformat.v4.new_markdown_cell("# Baseline"), cell]
    (run.dir / "notebooks").mkdir(exist_ok=True)
    nbformat.write(nb, run.dir / "notebooks" / R.NOTEBOOKS["baseline"])
    R.record(run, "completed", status="completed")


def _project(tmp_path: Path) -> tuple[Path, list[R.Run]]:
    """A project folder: params/base.yaml reads params/tickets.jsonl (a relative path), params/variants/r8.yaml
    inherits it; one completed run of each under runs/."""
    project = tmp_path / "project"
    (project / "params" / "variants").mkdir(parents=True)
    raw = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    raw["data"]["source"] = {"path": "tickets.jsonl"}
    raw["experiment"]["variant"] = "base"
    (project / "params" / "base.yaml").write_text(yaml.safe_dump(raw))
    (project / "params" / "tickets.jsonl").write_text(
        json.dumps({"id": "a", "text": "t", "answer": "{}", "category": "billing"}) + "\n")
    (project / "params" / "variants" / "r8.yaml").write_text(
        "parent: ../base.yaml\nexperiment: {variant: r8}\nmethod: {r: 8, alpha: 16}\n")
    runs = []
    for card, p in (("base.yaml", 0.5), ("variants/r8.yaml", 0.8)):
        loaded = load_card(project / "params" / card)
        run = R.new_run(loaded, project / "runs")
        _finish(run, loaded, p, len(runs) + 1)
        runs.append(run)
    return project, runs


def test_the_report_folder_carries_no_machine_path_and_fits_a_page(tmp_path: Path) -> None:
    project, (base, r8) = _project(tmp_path)
    rating = ABRating(r8.dir, rater="tester", per_category=1, against=base.dir)  # two variants rated blind
    for item in rating.session["items"]:
        rating.rate("a" if item["a_is"] == "r8" else "b")
    index = build_report(project / "runs", "smoke", resamples=100)
    out = index.parent
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} >= {".html", ".json", ".png"} and len(files) >= 5
    machine = [str(tmp_path), str(REPO), sys.prefix, f"{Path.home()}/", f"{tempfile.gettempdir()}/"]
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        text = re.sub(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+", "", text)  # embedded images are not paths
        found = [m for m in machine if m in text] + ABSOLUTE.findall(text)
        assert not found, f"{path.relative_to(out)} holds machine paths: {found}"
    comparison = json.loads((out / "comparison.json").read_text())
    rows = {r["variant"]: r for r in comparison["runs"]}
    assert rows["r8"]["dir"] == f"runs/smoke/{r8.run_id}" and (project / rows["r8"]["dir"]).is_dir()
    assert set(rows["r8"]["changed"]) == {"experiment.variant", "method.r", "method.alpha"}  # no data.source.path
    page = index.read_text()
    page_of_run = (out / "runs" / base.run_id / "01_baseline.html").read_text()
    assert f"runs/smoke/{base.run_id}/baseline" in page_of_run and "$PYTHON/lib/python3" in page_of_run
    assert "params/variants/r8.yaml" in json.dumps(comparison) or "params/base.yaml" in page
    assert f"Human verdict</b> (blind A/B, base ({base.run_id}) vs r8 ({r8.run_id})" in page
    assert "people prefer r8: r8 3, base 0, tie 0 of 3 rated" in page
    runs_table = page.split("<h2>Runs</h2>", 1)[1]
    head = runs_table.split("</thead>", 1)[0]
    assert 6 <= head.count("<th>") <= len(DECISION_COLUMNS)  # the decision table: a page wide
    assert all(f"<th>{c}</th>" in runs_table for c in COST_COLUMNS[1:]) and "<details>" in runs_table
    assert "anywhere" not in STYLE and "break-all" not in STYLE


def test_shareable_rewrites_paths_only(tmp_path: Path, monkeypatch) -> None:
    from labkit.experiment.shareable import machine_prefixes, shareable

    monkeypatch.chdir(tmp_path)  # the working folder is the project's here
    root = tmp_path / "runs"
    prefixes = machine_prefixes(root)
    text = (f"run_dir = '{root}/exp/r1'; {root.parent} · {sys.prefix}/lib/x.py:3 · {Path.home()}/.cache/y · "
            "/home/ana/data/t.jsonl · https://x.org/tmp/a/b · tokens/s · </td></tr> · data:image/png;base64,/9j/tmp/a+/home/b")
    assert shareable(text, prefixes) == (
        "run_dir = 'runs/exp/r1'; . · $PYTHON/lib/x.py:3 · ~/.cache/y · …/t.jsonl · https://x.org/tmp/a/b · tokens/s · "
        "</td></tr> · data:image/png;base64,/9j/tmp/a+/home/b")
