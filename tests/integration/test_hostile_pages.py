"""Nothing from a card, the data or a model's answers executes in a viewer: hostile strings planted in the card's
hypothesis, in the data's inputs and categories, and in the answers, then every page labkit writes — the report's
index, every run's notebook pages, stage 02's samples, the export's README and model card — opened in headless
Chromium, whose pages must run no planted script (an init script counts every planted handler that fires)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml
from conftest import labkit
from nbclient import NotebookClient
from nbconvert.filters.markdown import markdown2html

from labkit.data.tickets import generate_tickets
from labkit.experiment.report import render_notebooks

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
FIRE = "window.__ran=(window.__ran||0)+1"
HOSTILE = [f"<img src=x onerror=\"{FIRE}\">", f"<script>{FIRE}</script>", f"<svg onload=\"{FIRE}\"></svg>",
           f"[click me](javascript:{FIRE})", f"`</code><img src=y onerror=\"{FIRE}\">`",
           f"```\n<img src=z onerror=\"{FIRE}\">\n```"]


def _hostile_card(tmp: Path, repo: Path) -> Path:
    rows, _ = generate_tickets(rows=60, seed=3)
    for i, row in enumerate(rows[:20]):  # inputs of every split carry a payload; one category name is a payload
        row["text"] = f"{row['text']} {HOSTILE[i % len(HOSTILE)]}"
    for row in rows:
        if row["category"] == rows[0]["category"]:
            row["category"] = f"billing<img src=c onerror=\"{FIRE}\">"
            answer = json.loads(row["answer"])
            answer["category"] = row["category"]
            row["answer"] = json.dumps(answer)
    data = tmp / "hostile.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = yaml.safe_load((repo / "params" / "smoke.yaml").read_text())
    raw["experiment"].update(id="hostile", hypothesis="A tiny model answers tickets. " + " ".join(HOSTILE))
    raw["data"]["source"] = {"path": str(data)}
    card = tmp / "hostile.yaml"
    card.write_text(yaml.safe_dump(raw))
    return card


def _answers_notebook(run: Path, out: Path) -> Path:
    """Stage 05's display calls, in a real kernel, on answers that are payloads: the tables, the paired view's text,
    the blind A/B items (static), as an archived notebook of a copy of the run."""
    copy = out / run.name
    shutil.copytree(run, copy)
    for name in ("comparison/tuned_predictions.jsonl", "baseline/baseline_predictions.jsonl"):
        path = copy / name
        if path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            for i, row in enumerate(rows):
                row["prediction"] = HOSTILE[i % len(HOSTILE)]
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"""
import json
from pathlib import Path
from labkit.show import tables as show, widgets
from labkit.stages import comparison
run = Path({str(copy)!r})
read = lambda p: [json.loads(l) for l in (run / p).read_text().splitlines()]
base, tuned = read("baseline/baseline_predictions.jsonl"), read("comparison/tuned_predictions.jsonl")
display(show.table(comparison.examples_table(base, tuned)))
display(show.table(comparison.failing_table(base, tuned)))
display(show.md("The worst answer: " + tuned[0]["prediction"]))
widgets.ab_rating(run)
""")])
    NotebookClient(book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(copy)}}).execute()
    target = copy / "notebooks" / "05_comparison.ipynb"
    nbformat.write(book, target)
    return copy


def test_planted_scripts_run_in_no_page(tmp_path: Path, repo: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (`make test` installs it with apt-get where it can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements.txt)")
    runs = tmp_path / "runs"
    proc = labkit("run", str(_hostile_card(tmp_path, repo)), runs=runs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p for p in (runs / "hostile").iterdir() if not p.name.startswith("_")]
    assert labkit("compare", "hostile", "--resamples", "100", runs=runs).returncode == 0
    exported = labkit("export", run.name, "--out", str(tmp_path / "export"), runs=runs)
    assert exported.returncode == 0, exported.stdout[-3000:] + exported.stderr[-3000:]
    readme = (tmp_path / "export" / "README.md").read_text()
    assert "&lt;img src=x onerror" in readme  # the hypothesis, shown as text

    pages = sorted((runs / "hostile" / "_report").rglob("*.html")) + sorted(run.rglob("*.html"))
    for name in ("README.md", "MODEL_CARD.md"):
        if (tmp_path / "export" / name).exists():
            page = tmp_path / f"{name}.html"
            page.write_text(f"<!doctype html><meta charset=utf-8><body>{markdown2html((tmp_path / 'export' / name).read_text())}")
            pages.append(page)
    copy = _answers_notebook(run, tmp_path / "answers")
    pages += render_notebooks(copy, tmp_path / "answers" / "pages")
    assert len(pages) >= 10 and any(p.name == "samples.html" for p in pages)

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=str(CHROMIUM),
                                                       args=ARGS, headless=True)
        browser.add_init_script("window.__ran = 0")
        dialogs: list[str] = []
        page = browser.new_page()
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        fired = {}
        for path in pages:
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            page.wait_for_timeout(200)
            if page.evaluate("window.__ran"):
                fired[str(path)] = page.eval_on_selector_all(
                    "[onerror], [onload], script", "els => els.map(e => e.outerHTML.slice(0, 160))")[:3]
            links = page.eval_on_selector_all("a[href^='javascript']", "els => els.length")
            assert links == 0, f"{path}: a javascript: link"
        browser.close()
    assert not dialogs and not fired, fired
