"""The experiment's shareable HTML report: an index page plus every run's executed notebooks (nbconvert).

runs/<experiment>/_report/
  index.html            the comparison of every run, plots, test openings, links
  comparison.json       the same as data (labkit.experiment.compare.compare_experiment)
  *.png                 loss curves, per-category bars with intervals, confusion matrices
  runs/<run_id>/NN_stage.html   each executed notebook rendered by nbconvert
The folder is self-contained (relative links, images next to the page): zip it and share it. It holds no machine
path: every file is written through `labkit.experiment.shareable` (run folders as runs/<experiment>/<run_id>).
"""

from __future__ import annotations

import html
import json
import logging
import re
from pathlib import Path
from typing import Any

import nbformat
import yaml
from nbconvert import HTMLExporter

from labkit.core import io
from labkit.core import runs as R
from labkit.core.io import read_jsonl
from labkit.core.run_card import recorded_length
from labkit.evaluate.ab_session import human_verdicts
from labkit.experiment.compare import compare_experiment
from labkit.experiment.runs_table import column_groups, fmt_change, fmt_interval, pair_rows, seed_rows, summary_rows
from labkit.experiment.shareable import machine_prefixes, shareable
from labkit.scoring.stopping import stopping_line
from labkit.show import plots
from labkit.show.plots import CATEGORY_TITLES


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, bool):
        return "✔" if value else "✘"
    return "<br>".join(html.escape(part) for part in str(value).split("; "))  # one changed key, one flag a line


def _titled(body: str, run_id: str, variant: str, stem: str, experiment: str) -> str:
    """A rendered notebook titled by its run and linked back to the experiment's index."""
    title = f"{variant} · {run_id} · {stem}"
    # the report is self-contained and opens offline: no require.js or MathJax from a CDN (the pages need neither)
    body = re.sub(r'<script[^>]*\bsrc="https?://[^"]*"[^>]*>\s*</script>', "", body)
    body = re.sub(r"<title>.*?</title>", f"<title>{html.escape(title)}</title>", body, count=1, flags=re.S)
    back = (f'<p style="font-family:system-ui,sans-serif;margin:1em"><a href="../../index.html#{html.escape(run_id)}">'
            f"← experiment {html.escape(experiment)}</a> · run <code>{html.escape(run_id)}</code> ({html.escape(variant)})"
            f" · {html.escape(stem)}</p>")
    # a wide DataFrame scrolls inside the page instead of widening it
    style = "<style>.jp-RenderedHTMLCommon table{display:block;max-width:100%;overflow-x:auto}</style>"
    body = body.replace("</head>", style + "</head>", 1)
    return re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + back, body, count=1)


def render_notebooks(run_dir: Path, out: Path, variant: str = "", experiment: str = "") -> list[Path]:
    """Render a run's executed notebooks to HTML (only those newer than their rendering), titled by the run and
    linked back to the experiment's index.

    Args:
        run_dir: the run folder.
        out: the folder for the HTML files.
        variant: the run's variant (in the title).
        experiment: the experiment id (in the link back).
    Returns:
        the HTML files, in stage order.
    """
    logging.getLogger("traitlets").setLevel(logging.ERROR)  # "alternative text is missing" on plot outputs

    pages = []
    for stage in R.STAGES:
        source = run_dir / "notebooks" / R.NOTEBOOKS[stage]
        if not source.exists():
            continue
        target = out / source.with_suffix(".html").name
        if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
            body, _ = HTMLExporter(embed_images=True).from_notebook_node(nbformat.read(source, as_version=4))
            page = _titled(body, run_dir.name, variant, source.stem, experiment)
            io.write_atomic(target, shareable(page, machine_prefixes(run_dir.parent.parent)))
        pages.append(target)
    return pages


def draw(comparison: dict[str, Any], out: Path) -> list[str]:
    """Draw the experiment's plots into `out`.

    Args:
        comparison: from compare_experiment.
        out: the report folder.
    Returns:
        the PNG file names written.
    """
    runs = [r for r in comparison["runs"] if "intervals" in r]
    histories = {f"{r['variant']} ({r['status']})": read_jsonl(Path(r["dir"]) / "training" / "log_history.jsonl")
                 for r in comparison["runs"]}
    histories = {k: v for k, v in histories.items() if v}
    written = []
    if histories:
        plots.loss_curves(histories, out / "loss_curves.png")
        written.append("loss_curves.png")
    if not runs:
        return written

    primary = runs[0]["primary_metric"]
    for metric in dict.fromkeys([primary, "per_category_f1"]):
        per_run = {f"{r['variant']} ({r['run_id'][-8:]})": r["intervals"]["per_category"].get(metric) for r in runs}
        if not all(per_run.values()):
            continue
        values = {"baseline": {c: v["baseline"] for c, v in next(iter(per_run.values())).items()}}
        values.update({name: {c: v["tuned"] for c, v in cats.items()} for name, cats in per_run.items()})
        shown = "per_category_f1" if metric in ("per_category_f1", "macro_f1") else metric
        name = f"{metric}.png" if metric.startswith("per_category") else f"per_category_{metric}.png"
        plots.category_bars_ci(values, shown, out / name, title=f"{CATEGORY_TITLES.get(shown, shown)} per category "
                               "(bars: 95% bootstrap intervals)")
        written.append(name)
    named = {"baseline": read_jsonl(Path(runs[0]["dir"]) / "baseline" / "baseline_predictions.jsonl")}
    named.update({f"{r['variant']} ({r['run_id'][-8:]})": read_jsonl(Path(r["dir"]) / "comparison" / "tuned_predictions.jsonl")
                  for r in runs})
    if all(rows and "predicted_category" in rows[0] and rows[0].get("category") is not None for rows in named.values()):
        card = yaml.safe_load((Path(runs[0]["dir"]) / "card.yaml").read_text(encoding="utf-8"))
        plots.confusion_matrices(named, out / "confusion_matrices.png", labels=(card["data"]["target_format"].get("labels")))
        written.append("confusion_matrices.png")
    return written


def _interval_lines(iv: dict[str, Any], ref: str) -> list[dict[str, Any]]:
    lines = [{"metric": m, ref: fmt_interval(v["baseline"]), "tuned": fmt_interval(v["tuned"]),
              "difference": fmt_interval(v["diff"], True)} for m, v in iv["overall"].items()]
    for group in ("per_category", "per_key"):
        for metric, parts in (iv.get(group) or {}).items():
            lines += [{"metric": f"{metric}[{c}]", ref: fmt_interval(v["baseline"]), "tuned": fmt_interval(v["tuned"]),
                       "difference": fmt_interval(v["diff"], True)} for c, v in parts.items()]
    return lines


def _run_section(row: dict[str, Any], pages: list[Path], out: Path) -> str:
    links = " · ".join(f'<a href="{p.relative_to(out).as_posix()}">{html.escape(p.stem)}</a>' for p in pages) or "no notebooks"
    parts = [f"<h3 id=\"{html.escape(row['run_id'])}\">{html.escape(row['variant'] or '')} — "
             f"<code>{html.escape(row['run_id'])}</code> · {html.escape(row['status'])}</h3>", f"<p>Notebooks: {links}</p>"]
    if row.get("reason"):
        parts.append(f"<p class=\"bad\">Reason: {html.escape(row['reason'])}</p>")
    if "intervals" not in row:
        return "\n".join(parts)
    parts.append(f"<p><b>Hypothesis:</b> {html.escape(row['hypothesis'])}</p><p><b>{html.escape(row['verdict'])}</b></p>")
    parts.append(f"<p>{html.escape(_stopping(Path(row['dir'])))}</p>")
    for people in human_verdicts(Path(row["dir"])):  # blind A/B ratings (base vs tuned, vs other runs), if any
        kappa = "" if people["kappa"] is None else f", Cohen's κ {people['kappa']:.2f}"
        pair = " vs ".join(f"{n} ({people['sources'][n]['run']})" if n in people["sources"] else n for n in people["sides"])
        parts.append(f"<p><b>Human verdict</b> (blind A/B, {html.escape(pair)}, order seed {people['seed']}): "
                     f"{html.escape(people['verdict'])}{kappa}.</p>")
    changed = row.get("changed") or {}
    items = "".join(f"<li><code>{html.escape(fmt_change(k, v))}</code></li>" for k, v in changed.items())
    parts.append(f"<p>Changed against its parent (<code>{html.escape(str(row.get('parent')))}</code>):</p>"
                 + (f"<ul>{items}</ul>" if items else "<p>nothing (a root card)</p>"))
    if not row["comparable"]:
        why = row.get("protocol_change_why") or "the card gives no reason"
        changes = ", ".join(f"{k}: {v['reference']} → {v['run']}" for k, v in row["protocol_changes"].items())
        parts.append(f"<p class=\"bad\">Not comparable: protocol keys differ from the reference run ({html.escape(changes)}). "
                     f"Why: {html.escape(why)}</p>")
    rails = (row.get("decision") or {}).get("guardrails") or []
    if rails:
        parts.append("<p>Guardrails against the reference:</p>" + _table(
            [{k: g.get(k) for k in ("guardrail", "metric", "reference", "value", "ok", "why")} for g in rails]))
    iv = row["intervals"]
    parts.append(f"<p>Against the baseline ({html.escape(str(row.get('baseline_prompt', 'training')))} prompt): "
                 f"{int(iv['level'] * 100)}% paired bootstrap intervals ({iv['resamples']} "
                 f"resamples of the {iv['n']} evaluation examples"
                 + (f", drawn as {iv['groups']} groups (data.fields.group)" if iv.get("groups") else "")
                 + "):</p>" + _table(_interval_lines(iv, "baseline")))
    if row.get("against_intervals"):
        parts.append(f"<p>Against variant {html.escape(row['against'])} (run <code>{html.escape(str(row['reference_run']))}"
                     "</code>), paired on the same examples:</p>" + _table(_interval_lines(row["against_intervals"], "reference")))
    pairs, found = row.get("paired"), row.get("concentration")
    if pairs and pairs.get("key"):
        parts.append("<p>Paired per example on {k} against the reference: {w} wins, {l} losses, {t} ties.</p>".format(
            k=html.escape(pairs["key"]), w=pairs["wins"], l=pairs["losses"], t=pairs["ties"]))
    if found:
        text = ("Concentrated: " + "; ".join(found["flags"]) if found["flags"] else "Not concentrated: " + found["statement"])
        parts.append(f"<p>{html.escape(text)}.</p>")
    return "\n".join(parts)


def _stopping(run_dir: Path) -> str:
    """The run's stopping line (`labkit.scoring.stopping.stopping_line`), from its baseline and tuned metrics."""
    named = {"baseline": io.read_json(run_dir / "baseline" / "baseline_metrics.json"),
             "tuned": io.read_json(run_dir / "comparison" / "tuned_metrics.json")}
    limit = ((yaml.safe_load((run_dir / "card.yaml").read_text(encoding="utf-8")).get("eval") or {}).get("max_new_tokens")
             or (recorded_length(run_dir) or {}).get("max_new_tokens"))
    return stopping_line(named, limit)


def _replicates(comparison: dict[str, Any]) -> str:
    """The replicated variants' section: every seed, then the variant across its seeds ("" without replicates)."""
    if not comparison.get("variants"):
        return ""
    return ("<h2>Variants across seeds</h2><p>Each variant trained with several seeds "
            "(<code>experiment.replicates</code>): "
            "every seed's value, their mean and spread, and the gain against the card's reference with a 95% interval "
            "over seeds and examples (two-level bootstrap, docs/deciding.md#replicates); the verdict is the "
            f"variant's, on the mean over its seeds.</p>{_table(seed_rows(comparison))}")


def _runs_tables(comparison: dict[str, Any]) -> str:
    """The runs table cut to fit a page: the decision, then cost and speed, then (folded) the rest of each run's row."""
    decision, cost, other = column_groups(summary_rows(comparison))
    return (_table(decision) + (f"<h3>Cost and speed</h3>{_table(cost)}" if cost else "")
            + (f"<details><summary>Reference, changes against the parent, reasons</summary>{_table(other)}</details>"
               if other else ""))


STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:.8em;margin:.5em 0;width:100%;table-layout:auto}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:break-word;hyphens:manual}
details{margin:.5em 0}summary{cursor:pointer}
th{background:#f3f3f3}.bad{color:#a00}.warn{background:#fff4d6;padding:.6em;border:1px solid #e0c060}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}code{font-size:.9em}"""


def build_report(root: Path, experiment: str, resamples: int = 2000) -> Path:
    """Compare every run of an experiment and write its HTML report.

    Args:
        root: the runs root.
        experiment: the experiment id.
        resamples: bootstrap resamples.
    Returns:
        the index page (runs/<experiment>/_report/index.html).
    """
    out = root / experiment / "_report"
    out.mkdir(parents=True, exist_ok=True)
    comparison = compare_experiment(root, experiment, resamples=resamples)
    prefixes = machine_prefixes(root)  # no machine path in a folder meant for sharing (labkit.experiment.shareable)
    io.write_atomic(out / "comparison.json", shareable(json.dumps(comparison, indent=1, ensure_ascii=False, default=str),
                                                       prefixes) + "\n")
    images = draw(comparison, out)
    sections = [_run_section(row, render_notebooks(Path(row["dir"]), out / "runs" / row["run_id"], row["variant"] or "",
                                                   experiment), out) for row in comparison["runs"]]
    openings = comparison["test_openings"]
    if openings:
        items = "".join(f"<li>#{e['opening']} {html.escape(str(e['when']))}: run <code>{html.escape(e['run_id'])}</code> by "
                        f"{html.escape(str(e.get('who')))}" + (f" — <b>REOPENED</b>: {html.escape(str(e.get('why')))}"
                                                                if e.get("reopen") else "")
                        + f" — {html.escape(str(e.get('verdict') or e.get('outcome')))}</li>" for e in openings)
        test = f"<div class=\"warn\"><b>Test split opened {len(openings)} time(s).</b><ul>{items}</ul></div>"
    else:
        test = "<p>The test split has not been opened (<code>labkit final RUN</code> opens it once).</p>"
    reference = comparison["reference"]
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(experiment)} · labkit</title>
<style>{STYLE}</style></head><body>
<h1>Experiment <code>{html.escape(experiment)}</code></h1>
<p>Generated {comparison['generated']} from <code>{html.escape(str(root / 'registry.jsonl'))}</code>: every run of the
experiment, failed, interrupted and invalid ones included. Reference protocol (evaluation, seed, data version, budget):
run <code>{html.escape(str(reference))}</code>; a run that differs is flagged not comparable.</p>
{test}
<h2>Runs</h2><p>Every run's primary metric and guardrails on the evaluation split (95% bootstrap intervals),
its gain against its card's reference (<code>experiment.target.against</code>), training time (m:ss), steps, tokens
seen (counted, padding excluded), tokens per second and model FLOPs utilisation (docs/cost.md), peak memory of a
training step, cost, and what its card changed against its parent.</p>{_runs_tables(comparison)}
{_replicates(comparison)}
<h2>Run against run</h2><p>Every two comparable runs evaluated on the same examples, paired example by example
(B − A; run metrics as the ratio B / A).</p>{_table(pair_rows(comparison))}
<h2>Plots</h2>{''.join(f'<img src="{name}" alt="{name}">' for name in images) or '<p>no plots yet</p>'}
<h2>Run by run</h2>{''.join(sections)}
</body></html>"""
    io.write_atomic(out / "index.html", shareable(page, prefixes))
    return out / "index.html"
