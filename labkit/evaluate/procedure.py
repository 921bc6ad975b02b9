"""The evaluation procedure shared by the baseline (stage 01), the comparison (stage 05) and `labkit final`.

Same split, same prompts, same decoding, same metrics. The baseline of an experiment is cached by
the hash of (model revision, evaluation data, evaluation procedure) and shared by its variants.
"""

from __future__ import annotations

from typing import Any

from labkit.evaluate.generation import generate_answers
from labkit.scoring.metrics import score_predictions


def evaluate_rows(model: Any, tokenizer: Any, card: Any, rows: list[dict[str, Any]],
                  label: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The evaluation procedure on given rows: the card's prompts and decoding, then its metrics.

    Used by `evaluate` (validation split) and by `labkit final` (test split), so both measure the same way.

    Args:
        model: the model to evaluate.
        tokenizer: its tokenizer.
        card: the card (prompt, eval settings, target format).
        rows: prepared rows ({"id", "input", "target", "category"}).
        label: progress label ("baseline", "tuned").
    Returns:
        (per-example rows with scores, aggregated metrics).
    """
    return score_answers(card, rows, generate_answers(model, tokenizer, card, rows, desc=f"{label}: generating"))


def score_answers(card: Any, rows: list[dict[str, Any]], answers: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Score answers given to `rows` (in their order) with the card's metrics.

    Args:
        card: the card (target format, eval.rouge).
        rows: prepared rows ({"id", "input", "target", "category"}).
        answers: one answer per row.
    Returns:
        (per-example rows with scores, aggregated metrics).
    """
    records = [{"id": r.get("id"), "category": r.get("category"), "input": r["input"], "target": r["target"],
                "prediction": a} for r, a in zip(rows, answers)]
    return score_predictions(records, card.data.target_format.model_dump(), card.eval.rouge.use_stemmer)
