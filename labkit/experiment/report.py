"""The experiment's shareable HTML report: an index page plus every run's executed notebooks (nbconvert).

runs/<experiment>/_report/
  index.html            the comparison of every run, plots, test openings, links
  comparison.json       the same as data (labkit.experiment.compare.compare_experiment)
  *.png                 loss curves, per-category bars with intervals, confusion matrices
  runs/<run_id>/NN_stage.html   each executed notebook rendered by nbconvert
The folder is self-contained (relative links, images next to the page): zip it and share it.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path
from typing import Any

from labkit.core import io
from labkit.core import runs as R
from labkit.core.io import read_jsonl
from labkit.experiment.compare import compare_experiment, fmt_interval, summary_rows

# nbconvert, nbformat, matplotlib (labkit.show.plots) take seconds to import: imported inside the functions that use
# them, so `labkit` commands and card checks start fast


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
    return html.escape(str(value))


def render_notebooks(run_dir: Path, out: Path) -> list[Path]:
    """Render a run's executed notebooks to HTML (only those newer than their rendering).

    Args:
        run_dir: the run folder.
        out: the folder for the HTML files.
    Returns:
        the HTML files, in stage order.
    """
    import nbformat
    from nbconvert import HTMLExporter

    logging.getLogger("traitlets").setLevel(logging.ERROR)  # "alternative text is missing" on plot outputs

    pages = []
    for stage in R.STAGES:
        source = run_dir / "notebooks" / R.NOTEBOOKS[stage]
        if not source.exists():
            continue
        target = out / source.with_suffix(".html").name
        if not target.exists() or target.stat().st_mtime < source.stat().st_mtime:
            body, _ = HTMLExporter(embed_images=True).from_notebook_node(nbformat.read(source, as_version=4))
            io.write_atomic(target, body)
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
    from labkit.show import plots  # matplotlib: loaded only when a report is drawn, not by every `labkit` command

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
    for metric in dict.fromkeys([runs[0]["primary_metric"], "per_category_f1"]):
        per_run = {r["variant"]: r["intervals"]["per_category"].get(metric) for r in runs}
        if not all(per_run.values()):
            continue
        values = {"baseline": {c: v["baseline"] for c, v in next(iter(per_run.values())).items()}}
        values.update({name: {c: v["tuned"] for c, v in cats.items()} for name, cats in per_run.items()})
        name = f"{metric}.png" if metric.startswith("per_category") else f"per_category_{metric}.png"
        plots.category_bars_ci(values, "f1" if metric == "per_category_f1" else metric, out / name)
        written.append(name)
    named = {"baseline": read_jsonl(Path(runs[0]["dir"]) / "baseline" / "baseline_predictions.jsonl")}
    named.update({r["variant"]: read_jsonl(Path(r["dir"]) / "comparison" / "tuned_predictions.jsonl") for r in runs})
    if all(rows and "predicted_category" in rows[0] and rows[0].get("category") is not None for rows in named.values()):
        plots.confusion_matrices(named, out / "confusion_matrices.png")
        written.append("confusion_matrices.png")
    return written


def _run_section(row: dict[str, Any], pages: list[Path], out: Path) -> str:
    links = " · ".join(f'<a href="{p.relative_to(out).as_posix()}">{html.escape(p.stem)}</a>' for p in pages) or "no notebooks"
    parts = [f"<h3 id=\"{html.escape(row['run_id'])}\">{html.escape(row['variant'] or '')} — "
             f"<code>{html.escape(row['run_id'])}</code> · {html.escape(row['status'])}</h3>", f"<p>Notebooks: {links}</p>"]
    if row.get("reason"):
        parts.append(f"<p class=\"bad\">Reason: {html.escape(row['reason'])}</p>")
    if "intervals" not in row:
        return "\n".join(parts)
    parts.append(f"<p><b>Hypothesis:</b> {html.escape(row['hypothesis'])}</p><p><b>{html.escape(row['verdict'])}</b></p>")
    changed = row.get("changed") or {}
    parts.append(f"<p>Changed against its parent (<code>{html.escape(str(row.get('parent')))}</code>): "
                 f"{html.escape(', '.join(f'{k} = {v}' for k, v in changed.items()) or 'nothing (a root card)')}</p>")
    if not row["comparable"]:
        why = row.get("protocol_change_why") or "the card gives no reason"
        changes = ", ".join(f"{k}: {v['reference']} → {v['run']}" for k, v in row["protocol_changes"].items())
        parts.append(f"<p class=\"bad\">Not comparable: protocol keys differ from the reference run ({html.escape(changes)}). "
                     f"Why: {html.escape(why)}</p>")
    iv = row["intervals"]
    lines = [{"metric": m, "baseline": fmt_interval(v["baseline"]), "tuned": fmt_interval(v["tuned"]),
              "difference": fmt_interval(v["diff"], True)} for m, v in iv["overall"].items()]
    for metric, cats in iv["per_category"].items():
        lines += [{"metric": f"{metric}[{c}]", "baseline": fmt_interval(v["baseline"]), "tuned": fmt_interval(v["tuned"]),
                   "difference": fmt_interval(v["diff"], True)} for c, v in cats.items()]
    parts.append(f"<p>{int(iv['level'] * 100)}% paired bootstrap intervals ({iv['resamples']} resamples of the "
                 f"{iv['n']} evaluation examples):</p>" + _table(lines))
    flags = (row.get("concentration") or {}).get("flags") or []
    parts.append("<p>Paired per example on {m}: {w} wins, {l} losses, {t} ties. {f}</p>".format(
        m=html.escape(row["primary_metric"]), w=row["paired"]["wins"], l=row["paired"]["losses"], t=row["paired"]["ties"],
        f=html.escape("Flags: " + "; ".join(flags) if flags else "The gain is not concentrated in a few examples or one category.")))
    return "\n".join(parts)


STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}
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
    io.write_json(out / "comparison.json", comparison)
    images = draw(comparison, out)
    sections = [_run_section(row, render_notebooks(Path(row["dir"]), out / "runs" / row["run_id"]), out)
                for row in comparison["runs"]]
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
<h2>Runs</h2>{_table(summary_rows(comparison))}
<h2>Plots</h2>{''.join(f'<img src="{name}" alt="{name}">' for name in images) or '<p>no plots yet</p>'}
<h2>Run by run</h2>{''.join(sections)}
</body></html>"""
    io.write_atomic(out / "index.html", page)
    return out / "index.html"
