"""The evaluation procedure shared by the baseline (stage 01), the comparison (stage 05) and `labkit final`.

Same split, same prompts, same decoding, same metrics. The baseline of an experiment is cached by
the hash of (model revision, evaluation data, evaluation procedure) and shared by its variants.
"""

from __future__ import annotations

import math
from typing import Any

from labkit.errors import NonFiniteError
from labkit.evaluate.generation import Answer, generate_with_stops
from labkit.scoring.metrics import score_predictions


def evaluate_rows(model: Any, tokenizer: Any, card: Any, rows: list[dict[str, Any]], label: str,
                  prompts: list[list[int]] | None = None,
                  stop_strings: list[str] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The evaluation procedure on given rows: the card's prompts and decoding, then its metrics.

    Used by `evaluate` (validation split) and by `labkit final` (test split), so both measure the same way.

    Args:
        model: the model to evaluate.
        tokenizer: its tokenizer.
        card: the card (prompt, eval settings, target format).
        rows: prepared rows ({"id", "input", "target", "category"}).
        label: progress label ("baseline", "tuned").
        prompts: each row's prompt ids (default: the training prompt; the baseline's other prompts pass theirs).
        stop_strings: strings generation also stops on (a card template's `stop`).
    Returns:
        (per-example rows with scores, aggregated metrics); each row records whether its answer stopped and its
        length in tokens (`stopped`, `answer_tokens`), aggregated as stop_rate and mean_answer_tokens.
    """
    answers = generate_with_stops(model, tokenizer, card, rows, desc=f"{label}: generating", prompts=prompts,
                                  stop_strings=stop_strings)
    return score_answers(card, rows, answers)


def score_answers(card: Any, rows: list[dict[str, Any]],
                  answers: list[str] | list[Answer]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Score answers given to `rows` (in their order) with the card's metrics.

    Args:
        card: the card (target format, eval.rouge).
        rows: prepared rows ({"id", "input", "target", "category"}).
        answers: one answer per row: its text, or a `generate_with_stops` Answer (then the row records `stopped` and
            `answer_tokens`, and the metrics stop_rate and mean_answer_tokens).
    Returns:
        (per-example rows with scores, aggregated metrics).
    Raises:
        NonFiniteError: a score came out NaN or infinite (never recorded as a score).
    """
    records = [{"id": r.get("id"), "category": r.get("category"), "input": r["input"], "target": r["target"],
                **({"prediction": a} if isinstance(a, str) else
                   {"prediction": a["text"], "stopped": a["stopped"], "answer_tokens": a["answer_tokens"]}),
                **({"group": r["group"]} if r.get("group") is not None else {})}
               for r, a in zip(rows, answers)]  # the group (data.fields.group): the verdict resamples whole groups
    scored, metrics = score_predictions(records, card.data.target_format.model_dump(), card.eval.rouge.use_stemmer)
    scores = ((f"row {r.get('id')}", {k: v for k, v in r.items() if isinstance(v, float)}) for r in scored)
    for where, values in [*scores, ("the metrics", metrics)]:
        bad = non_finite(values)
        if bad:
            raise NonFiniteError(f"evaluation: {where} scored {bad[0]} — a non-finite value is not a score; check the "
                                 "answers and the card's target format")
    return scored, metrics


def non_finite(values: Any, path: str = "") -> list[str]:
    """The non-finite numbers in nested dicts / lists, as "key.path = value" (empty: all finite).

    Args:
        values: a number, or dicts and lists of them (other values are ignored).
        path: the prefix of the keys named.
    Returns:
        one "path = value" per NaN or infinite number.
    """
    if isinstance(values, float):
        return [] if math.isfinite(values) else [f"{path or 'value'} = {values}"]
    if isinstance(values, dict):
        return [b for k, v in values.items() for b in non_finite(v, f"{path}.{k}" if path else str(k))]
    if isinstance(values, (list, tuple)):
        return [b for i, v in enumerate(values) for b in non_finite(v, f"{path}[{i}]")]
    return []
