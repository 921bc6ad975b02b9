"""Small display helpers for the notebooks: tables as DataFrames, markdown and HTML."""

from __future__ import annotations

from typing import Any

import pandas as pd
from IPython.display import HTML

from labkit.core.progress import fmt_seconds
from labkit.show.escape import markdown_html


def table(rows: list[dict[str, Any]] | dict[str, Any], columns: list[str] | None = None, digits: int = 3) -> Any:
    """A pandas DataFrame of rows (or of one {key: value} mapping), floats rounded.

    Args:
        rows: a list of dicts, or a mapping shown as two columns.
        columns: the columns to keep, in order.
        digits: rounding of floats.
    Returns:
        a DataFrame (rendered as an HTML table by Jupyter).
    """
    pd.set_option("display.max_colwidth", None)  # JSON targets and answers whole: a cut answer hides the wrong field
    if isinstance(rows, dict):
        rows = [{"key": k, "value": v} for k, v in rows.items()]
    frame = pd.DataFrame(rows)
    if columns:
        frame = frame[[c for c in columns if c in frame.columns]]
    return frame.round(digits)


def metrics_table(named: dict[str, dict[str, Any]]) -> Any:
    """Overall metrics of several models side by side ({label: metrics})."""
    names = sorted({m for v in named.values() for m in v["overall"]})
    return table([{"metric": m, **{label: v["overall"].get(m) for label, v in named.items()}} for m in names])


def per_category_table(named: dict[str, dict[str, Any]], metrics: tuple[str, ...] = ("f1", "field_accuracy")) -> Any:
    """Per-category metrics of several models side by side."""
    cats = sorted({c for v in named.values() for c in v["per_category"]})
    rows = []
    for cat in cats:
        row: dict[str, Any] = {"category": cat}
        for label, v in named.items():
            values = v["per_category"].get(cat, {})
            row["support"] = values.get("support", row.get("support"))
            for metric in metrics:
                if metric in values:
                    row[f"{metric} · {label}"] = values[metric]
        rows.append(row)
    return table(rows)


def per_key_table(named: dict[str, dict[str, Any]]) -> Any:
    """Slot precision, recall and F1 per JSON key of several models side by side, with the key's support."""
    keys = list(dict.fromkeys(k for v in named.values() for k in v.get("per_key") or {}))
    rows = []
    for key in keys:
        row: dict[str, Any] = {"key": key}
        for label, v in named.items():
            values = (v.get("per_key") or {}).get(key, {})
            row["support"] = values.get("support", row.get("support"))
            for metric in ("slot_precision", "slot_recall", "slot_f1"):
                row[f"{metric} · {label}"] = values.get(metric)
        rows.append(row)
    return table(rows)


def md(text: str) -> Any:
    """Markdown for display, rendered and sanitised (`labkit.show.escape.markdown_html`): the text interpolates cards,
    data and answers, and an archived notebook is opened in other people's browsers."""
    return HTML(markdown_html(text))


def html(text: str) -> Any:
    """HTML for display."""
    return HTML(text)


def fmt_gib(value: float | None, from_bytes: bool = False) -> str:
    """A size in GiB with two decimals (from bytes when from_bytes); "—" when unknown."""
    if value is None:
        return "—"
    return f"{value / 2**30 if from_bytes else value:.2f} GiB"


def readable(rows: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]] | dict[str, Any]:
    """Rows with byte counts shown as GiB and seconds as m:ss (keys ending in _bytes / _seconds / seconds)."""

    def one(key: str, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if key.endswith("bytes"):
                return fmt_gib(value, from_bytes=True)
            if key.endswith("seconds") or key.endswith("runtime"):
                return fmt_seconds(value)
        return value

    if isinstance(rows, dict):
        return {k: one(k, v) for k, v in rows.items()}
    return [{k: one(k, v) for k, v in r.items()} for r in rows]
