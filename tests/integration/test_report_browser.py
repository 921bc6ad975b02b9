"""The report of an experiment with a label-task card and a second variant judged against the first, opened in a real
headless browser (Debian's chromium driven by Playwright): no console errors, every image drawn, no table wider than
the page, every link resolves; a screenshot is kept in the report folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import yaml
from conftest import labkit

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _cards(tmp: Path, repo: Path) -> tuple[Path, Path]:
    base = tmp / "labels.yaml"
    base.write_text(yaml.safe_dump({
        "parent": str(repo / "params" / "smoke.yaml"),
        "experiment": {"id": "labels", "variant": "label-base",
                       "hypothesis": "A tiny random Llama answers the ticket category (a plumbing check of label scoring).",
                       "target": {"behaviour": "classification", "primary_metric": "accuracy", "min_improvement": 0.0},
                       "guardrails": [{"metric": "per_category_f1", "max_drop": 1.0}]},
        "data": {"fields": {"target": "category"}, "target_format": {"kind": "label", "required_keys": []},
                 "prompt": {"system": "Reply with the ticket's category only."}},
        "eval": {"max_new_tokens": 6}}))
    variant = tmp / "labels-r8.yaml"
    variant.write_text(yaml.safe_dump({
        "parent": "labels.yaml",
        "experiment": {"variant": "label-r8",
                       "hypothesis": "LoRA r=8 keeps label-base's accuracy and trains in at most 100 times its time.",
                       "target": {"against": "label-base", "min_improvement": -1.0},
                       "guardrails": [{"metric": "train_seconds", "max_ratio": 100.0},
                                      {"metric": "per_category_f1", "max_drop": 1.0}]},
        "method": {"r": 8, "alpha": 16}}))
    return base, variant


def _links(page) -> list[str]:
    return page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")


def _check_page(page, url: str, errors: list[str]) -> list[str]:
    page.goto(url)
    page.wait_for_load_state("load")
    broken = page.eval_on_selector_all("img", "els => els.filter(e => !(e.complete && e.naturalWidth > 0 && "
                                       "e.naturalHeight > 0)).map(e => e.src.slice(0, 80))")
    assert not broken, f"images not drawn on {url}: {broken}"
    width = page.evaluate("document.documentElement.clientWidth")
    wide = page.eval_on_selector_all("table", f"els => els.filter(e => e.getBoundingClientRect().right > {width} + 1)"
                                              ".map(e => e.getBoundingClientRect().width)")
    assert not wide, f"tables wider than the page ({width}px) on {url}: {wide}"
    assert not errors, f"console errors on {url}: {errors}"
    return _links(page)


def _resolves(page, link: str) -> None:
    parsed = urlparse(link)
    assert parsed.scheme == "file", f"a link leaves the report folder: {link}"
    target = Path(unquote(parsed.path))
    assert target.exists(), f"broken link: {link}"
    if parsed.fragment:
        page.goto(link)
        assert page.evaluate(f"!!document.getElementById({json.dumps(unquote(parsed.fragment))})"), f"no anchor: {link}"


def test_label_experiment_report_in_a_headless_browser(tmp_path: Path, repo: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (`make test` installs it with apt-get where it can)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements.txt)")
    runs = tmp_path / "runs"
    base, variant = _cards(tmp_path, repo)
    for card in (base, variant):
        proc = labkit("run", str(card), runs=runs)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    compared = labkit("compare", "labels", "--resamples", "200", runs=runs)
    assert compared.returncode == 0, compared.stderr
    out = runs / "labels" / "_report"
    comparison = json.loads((out / "comparison.json").read_text())
    by_variant = {r["variant"]: r for r in comparison["runs"]}
    base_row, r8 = by_variant["label-base"], by_variant["label-r8"]
    assert r8["against"] == "label-base" and r8["reference_run"] == base_row["run_id"]
    assert r8["verdict"].startswith(("CONFIRMED against variant label-base", "NOT CONFIRMED against variant label-base",
                                     "INCONCLUSIVE against variant label-base"))  # judged: n and its interval said
    assert r8["decision"]["primary"]["n"] == r8["intervals"]["n"] and f"n = {r8['intervals']['n']}" in r8["verdict"]
    rail = next(g for g in r8["decision"]["guardrails"] if g["metric"] == "train_seconds")
    assert rail["reference"] == base_row["run_metrics"]["train_seconds"] > 0
    assert r8["paired"]["key"] == "correct" and sum(r8["paired"][k] for k in ("wins", "losses", "ties")) == r8["intervals"]["n"]
    assert r8["changed"]["method.r"] == {"old": 4, "new": 8}
    assert len(comparison["pairs"]) == 1 and comparison["pairs"][0]["metric"] == "accuracy"
    run_dir = tmp_path / r8["dir"]  # the report names run folders relative to the project (runs/…)
    log = run_dir / "logs" / "libraries.log"
    assert log.exists(), "library messages go to the run's log file"
    notebook = json.loads((run_dir / "notebooks" / "05_comparison.ipynb").read_text())
    streams = [o for c in notebook["cells"] for o in c.get("outputs", []) if o.get("name") == "stderr"]
    assert not any("Warning" in "".join(o["text"]) or "warn(" in "".join(o["text"]) for o in streams), streams
    for path in sorted((run_dir / "notebooks").glob("*.ipynb")):  # progress bars as text, never a widget
        assert "widgets" not in json.loads(path.read_text())["metadata"], f"{path.name} holds widget state"
    index = (out / "index.html").read_text()
    assert "method.r: 4 → 8" in index and "Run against run" in index

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(  # a fresh profile folder: the --user-data-dir of the run
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), args=ARGS, headless=True,
            viewport={"width": 1280, "height": 900})
        page = browser.new_page()
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        links = _check_page(page, (out / "index.html").as_uri(), errors)
        page.screenshot(path=str(out / "screenshot.png"), full_page=True)
        assert len(links) >= 10
        pages = sorted({link.split("#")[0] for link in links if link.endswith(".html")})
        for link in links:
            _resolves(page, link)
        for url in pages:  # every run page: titled by its run, linked back to the index
            errors.clear()
            back = _check_page(page, url, errors)
            run_id = Path(urlparse(url).path).parent.name
            assert run_id in page.title(), page.title()
            assert any(b.split("#")[0].endswith("_report/index.html") for b in back), f"{url} does not link back"
        browser.close()
    assert (out / "screenshot.png").stat().st_size > 20_000
    shutil.copy(out / "screenshot.png", tmp_path.parent / "report_screenshot.png")  # kept beside the test's folder
