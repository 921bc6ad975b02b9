"""Plots the notebooks show and archive (matplotlib, saved as PNG next to the data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from labkit.scoring.metrics import OTHER, _norm
from labkit.show.memory_labels import label as memory_label

# what a per-category value is, said in the chart's title
CATEGORY_TITLES = {"f1": "F1 (harmonic mean of precision and recall)", "per_category_f1": "F1",
                   "macro_f1": "F1 (macro-F1 averages these)", "accuracy": "accuracy within the category (its recall)",
                   "precision": "precision", "recall": "recall", "field_accuracy": "field accuracy (mean per example)",
                   "slot_f1": "slot F1 (micro)"}


def _save(fig: Any, path: Path | None) -> Any:
    """Lay out, save as PNG, and close (the notebook displays the returned figure once)."""
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def loss_curve(history: list[dict[str, Any]], path: Path | None = None, title: str = "training loss") -> Any:
    """Training (and evaluation) loss against the optimiser step."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    train = [(r["step"], r["loss"]) for r in history if "loss" in r]
    evals = [(r["step"], r["eval_loss"]) for r in history if "eval_loss" in r]
    if train:
        ax.plot(*zip(*train), marker=".", label="train loss")
    if evals:
        ax.plot(*zip(*evals), marker="o", label="validation loss")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (completion tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def category_bars(per_category: dict[str, dict[str, dict[str, float]]], metric: str, path: Path | None = None) -> Any:
    """Grouped bars of one metric per category, one bar per model (e.g. baseline vs tuned).

    Args:
        per_category: {model label: {category: {metric: value}}}.
        metric: the metric to draw.
        path: where to save the PNG.
    """
    values = {label: {c: {"value": v.get(metric, 0.0), "low": None, "high": None} for c, v in cats.items()}
              for label, cats in per_category.items()}
    return category_bars_ci(values, metric, path, title=f"{CATEGORY_TITLES.get(metric, metric)} per category")


def split_distribution(counts: dict[str, dict[str, int]], path: Path | None = None) -> Any:
    """Stacked bars: rows per category in each split."""
    splits = list(counts)
    cats = sorted({c for v in counts.values() for c in v})
    fig, ax = plt.subplots(figsize=(6, 3.4))
    bottom = [0] * len(splits)
    for cat in cats:
        values = [counts[s].get(cat, 0) for s in splits]
        ax.bar(splits, values, bottom=bottom, label=cat)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("rows")
    ax.set_title("rows per category and split")
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def length_histogram(lengths: dict[str, list[int]], max_length: int, path: Path | None = None) -> Any:
    """Token-length histograms per split with the card's max_length drawn."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for split, values in lengths.items():
        if values:
            ax.hist(values, bins=30, alpha=0.55, label=f"{split} (n={len(values)})")
    ax.axvline(max_length, color="red", linestyle="--", label=f"max_length {max_length}")
    ax.set_xlabel("tokens (prompt + completion)")
    ax.set_ylabel("rows")
    ax.legend(fontsize=8)
    return _save(fig, path)


def memory_breakdown(estimates: list[dict[str, Any]], measured: list[float | None], path: Path | None = None) -> Any:
    """Stacked estimate of a training step's peak memory per sequence length, with the measured peak marked.

    Args:
        estimates: from `labkit.preflight.memory.estimate_step`, one per sequence length.
        measured: measured peak (weights + step) in bytes per estimate, or None.
        path: where to save the PNG.
    """
    gib = 1024**3
    fig, ax = plt.subplots(figsize=(6.8, 3.8))
    labels = [f"{e['seq_len']} tokens × {e['micro_batch']}" for e in estimates]
    parts = ["weights_frozen", "weights_4bit", "trainable_parameters", "optimizer_states"]
    bottom = [0.0] * len(estimates)
    for part in parts:
        values = [e["breakdown"][part] / gib for e in estimates]
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=memory_label(part), width=0.5)
            bottom = [b + v for b, v in zip(bottom, values)]
    rest = [(e["peak_bytes"] / gib) - b for e, b in zip(estimates, bottom)]
    ax.bar(labels, rest, bottom=bottom, label="activations, loss head, gradients (at the peak phase)", width=0.5)
    for i, value in enumerate(measured):
        if value is not None:
            ax.plot([i - 0.3, i + 0.3], [value / gib] * 2, color="black", linewidth=2.5,
                    label="measured peak" if i == 0 else None)
    ax.set_ylabel("GiB")
    ax.set_title("peak memory of one training step: estimate (bars) vs measured (line)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_ylim(0, max(max(e["peak_bytes"] for e in estimates), max((m or 0) for m in measured)) / gib * 1.45)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def loss_curves(histories: dict[str, list[dict[str, Any]]], path: Path | None = None) -> Any:
    """Training loss (solid) and validation loss (dashed, same colour) of several runs, overlaid.

    Args:
        histories: {run label: log_history rows}.
        path: where to save the PNG.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    for i, (label, history) in enumerate(histories.items()):
        colour = f"C{i % 10}"
        train = [(r["step"], r["loss"]) for r in history if "loss" in r]
        evals = [(r["step"], r["eval_loss"]) for r in history if "eval_loss" in r]
        if train:
            ax.plot(*zip(*train), color=colour, label=f"{label} · train")
        if evals:
            ax.plot(*zip(*evals), color=colour, linestyle="--", marker="o", label=f"{label} · validation")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (completion tokens)")
    ax.set_title("loss curves of the experiment's runs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def category_bars_ci(values: dict[str, dict[str, dict[str, float | None]]], metric: str, path: Path | None = None,
                     title: str | None = None) -> Any:
    """Grouped bars of one metric per category with bootstrap intervals as error bars (none where low/high are None).

    Args:
        values: {model label: {category: {"value", "low", "high"}}}.
        metric: the metric's name (axis label).
        path: where to save the PNG.
        title: the title (default: the metric with "95% bootstrap intervals").
    """
    labels = list(values)
    cats = sorted({c for v in values.values() for c in v})
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(min(max(6.0, 0.6 * len(cats) * max(len(labels), 1) ** 0.5), 14.0), 3.8))
    for i, label in enumerate(labels):
        leaves = [values[label].get(c) or {"value": None, "low": None, "high": None} for c in cats]
        heights = [leaf["value"] or 0.0 for leaf in leaves]
        low = [h - (leaf["low"] if leaf["low"] is not None else h) for h, leaf in zip(heights, leaves)]
        high = [(leaf["high"] if leaf["high"] is not None else h) - h for h, leaf in zip(heights, leaves)]
        has_intervals = any(leaf["low"] is not None for leaf in leaves)
        ax.bar([x + i * width for x in range(len(cats))], heights, width, yerr=[low, high] if has_intervals else None,
               capsize=3, label=label)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(cats))], [c[:18] for c in cats],
                  rotation=20 if len(cats) <= 8 else 60, ha="right", fontsize=8 if len(cats) <= 12 else 6)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel(metric)
    ax.set_title(title or f"{CATEGORY_TITLES.get(metric, metric)} per category (bars: 95% bootstrap intervals)", fontsize=9)
    ax.legend(loc="upper left", ncol=min(len(labels), 3), fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def confusion_counts(rows: list[dict[str, Any]], labels: list[str], top_k: int = 30) -> tuple[list[str], list[str], Any]:
    """Counts of reference label × answer over the known labels plus one "other answer" column.

    Args:
        rows: scored predictions with `category` and `predicted_category`.
        labels: the known labels (the card's target_format.labels, else the references' labels).
        top_k: beyond this many labels, the top_k most frequent references are kept and the rest grouped.
    Returns:
        (row labels, column labels, counts array).
    """
    gold = [_norm(r["category"]) for r in rows]
    support = {label: gold.count(label) for label in labels}
    kept = labels if len(labels) <= top_k else sorted(sorted(labels, key=lambda x: -support[x])[:top_k])
    rest = f"{len(labels) - len(kept)} other labels" if len(kept) < len(labels) else None
    row_names = kept + ([rest] if rest else [])
    columns = kept + ([rest] if rest else []) + [OTHER]
    counts = np.zeros((len(row_names), len(columns)), dtype=int)
    for g, r in zip(gold, rows):
        i = row_names.index(g) if g in kept else (len(kept) if rest else None)
        if i is None:  # a reference outside the known labels: counted under "other labels" only when grouped
            continue
        p = r["predicted_category"]
        j = columns.index(p) if p in kept else (len(kept) if rest and p in labels else len(columns) - 1)
        counts[i, j] += 1
    return row_names, columns, counts


def confusion_matrices(named: dict[str, list[dict[str, Any]]], path: Path | None = None,
                       labels: list[str] | None = None, top_k: int = 30) -> Any:
    """One confusion matrix (reference label × answer) per model, over the known labels plus one "other answer"
    column for every answer outside them; readable up to 30 labels, the 30 most frequent beyond that.

    Args:
        named: {model label: scored predictions with `category` and `predicted_category`}.
        path: where to save the PNG.
        labels: the known labels (default: the references' labels).
        top_k: the most labels drawn one by one.
    """
    labels = labels or sorted({_norm(r["category"]) for rows in named.values() for r in rows})
    shown = min(len(labels), top_k) + (len(labels) > top_k)
    side = max(2.6, 0.32 * (shown + 1) + 1.6)
    across = len(named) if shown <= 10 else 1  # wide matrices one under the other
    down = -(-len(named) // across)
    fig, axes = plt.subplots(down, across, figsize=(side * across + 0.8, side * down), squeeze=False)
    for ax in axes.flat[len(named):]:
        ax.axis("off")
    for ax, (label, rows) in zip(axes.flat, named.items()):
        row_names, columns, counts = confusion_counts(rows, labels, top_k)
        ax.imshow(counts, cmap="Blues", aspect="auto")
        for (i, j), value in np.ndenumerate(counts):
            if value:
                ax.text(j, i, str(value), ha="center", va="center", fontsize=7,
                        color="white" if value > counts.max() / 2 else "black")
        ax.set_xticks(range(len(columns)), [c[:18] for c in columns], rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(row_names)), [c[:18] for c in row_names], fontsize=7)
        ax.set_xlabel("answer")
        ax.set_ylabel("reference")
        right = np.trace(counts[:, : len(row_names)]) if len(row_names) else 0
        ax.set_title(f"{label}: {right}/{counts.sum()} right", fontsize=8)
    fig.suptitle(f"confusion matrices over {len(labels)} known labels (+ other answer)", fontsize=9)
    return _save(fig, path)


def stopping_metric_curve(stopping: dict[str, Any], path: Path | None = None, title: str = "early stopping") -> Any:
    """The early-stopping metric at each evaluation during training, the chosen (best) checkpoint marked.

    Args:
        stopping: `labkit.train.early_stopping.summary` (training/outcome.json's "early_stopping").
        path: where to save the PNG.
        title: the figure's title.
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    steps = [e["step"] for e in stopping["evaluations"]]
    ax.plot(steps, [e["value"] for e in stopping["evaluations"]], marker="o", label=stopping["metric"])
    if stopping["best_step"] is not None:
        ax.scatter([stopping["best_step"]], [stopping["best_value"]], s=160, facecolors="none", edgecolors="red",
                   zorder=3, label=f"best: {stopping['best_checkpoint']} (the adapter)")
    if stopping["stopped_early"]:
        ax.axvline(stopping["stopped_at_step"], color="grey", linestyle="--", label="stopped here")
    ax.set_xlabel("optimiser step")
    ax.set_ylabel(f"{stopping['metric']} ({'higher' if stopping['greater_is_better'] else 'lower'} is better)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
