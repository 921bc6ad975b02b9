"""Plots the notebooks show and archive (matplotlib, saved as PNG next to the data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt


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
    labels = list(per_category)
    cats = sorted({c for v in per_category.values() for c in v})
    width = 0.8 / max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(max(5.5, 1.3 * len(cats)), 3.6))
    for i, label in enumerate(labels):
        values = [per_category[label].get(c, {}).get(metric, 0.0) for c in cats]
        ax.bar([x + i * width for x in range(len(cats))], values, width, label=label)
    ax.set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(cats))], cats, rotation=20)
    ax.set_ylim(0, 1.22)  # room above the bars for the legend
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per category")
    ax.legend(loc="upper left", ncol=len(labels))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


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
        estimates: from `labkit.memory.estimate_step`, one per sequence length.
        measured: measured peak (weights + step) in bytes per estimate, or None.
        path: where to save the PNG.
    """
    gib = 1024**3
    fig, ax = plt.subplots(figsize=(6.8, 3.8))
    labels = [f"{e['seq_len']} tokens × {e['micro_batch']}" for e in estimates]
    parts = ["weights (frozen)", "weights (4-bit)", "trainable parameters", "optimiser states"]
    bottom = [0.0] * len(estimates)
    for part in parts:
        values = [e["breakdown"][part] / gib for e in estimates]
        if any(values):
            ax.bar(labels, values, bottom=bottom, label=part, width=0.5)
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
