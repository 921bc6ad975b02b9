"""Slot filling on JSON answers: precision, recall and F1 over the key–value pairs of the reference and the answer.

A slot is one (key, value) pair with a value that is not null. A reference that leaves out an optional key
expects no slot for it, so a perfect answer scores 1.0 whatever keys the reference carries. Counts are kept
per example (true positives, false positives, false negatives, overall and per key), so the aggregate, the
per-key view and the bootstrap are all sums of per-example counts (micro-averaged, the slot-filling standard).
"""

from __future__ import annotations

import json
from typing import Any

SLOT_METRICS = ("slot_precision", "slot_recall", "slot_f1")


def _canonical(value: Any) -> Any:
    """The value as compared, inside lists and objects too: text whitespace-normalised and case-folded, a whole float
    as an integer (JSON's 3 and 3.0 are one number)."""
    if isinstance(value, str):
        return " ".join(value.split()).casefold()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def slot_value(value: Any) -> str | None:
    """A value as compared: whitespace-normalised, case-folded text, a whole float as an integer, lists and objects
    as JSON with sorted keys (their text normalised the same way); None for null or empty text."""
    if value is None:
        return None
    value = _canonical(value)
    text = (json.dumps(value, sort_keys=True, ensure_ascii=False) if isinstance(value, (dict, list))
            else str(value).casefold())  # text is already normalised; a number or a boolean has no spaces
    return text or None


def slot_counts(answer: dict[str, Any], reference: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """True positives, false positives and false negatives of one answer's slots.

    Args:
        answer: the parsed answer ({} when it is not JSON).
        reference: the parsed reference.
        keys: the card's declared keys (required + optional): the per-key counts cover these.
    Returns:
        {"slot_tp", "slot_fp", "slot_fn", "slot_f1" (this example's F1; 1.0 when neither side has a slot),
         "slots": {key: [tp, fp, fn]}}.
    """
    gold = {k: slot_value(v) for k, v in reference.items()}
    pred = {k: slot_value(v) for k, v in answer.items()}
    gold = {k: v for k, v in gold.items() if v is not None}
    pred = {k: v for k, v in pred.items() if v is not None}
    per_key: dict[str, list[int]] = {}
    tp = fp = fn = 0
    for key in set(gold) | set(pred):
        hit = key in gold and key in pred and gold[key] == pred[key]
        counts = [int(hit), int(key in pred and not hit), int(key in gold and not hit)]
        tp, fp, fn = tp + counts[0], fp + counts[1], fn + counts[2]
        if key in keys:
            per_key[key] = counts
    denominator = 2 * tp + fp + fn
    return {"slot_tp": tp, "slot_fp": fp, "slot_fn": fn, "slot_f1": 2 * tp / denominator if denominator else 1.0,
            "slots": {k: per_key.get(k, [0, 0, 0]) for k in keys}}


def prf(tp: float, fp: float, fn: float) -> dict[str, float]:
    """Precision, recall and F1 from counts (0.0 where undefined)."""
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def aggregate_slots(rows: list[dict[str, Any]], keys: list[str]) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Micro-averaged slot precision, recall and F1 overall and per declared key.

    Args:
        rows: scored JSON examples (with `slot_tp`, `slot_fp`, `slot_fn`, `slots`).
        keys: the declared keys.
    Returns:
        ({"slot_precision", "slot_recall", "slot_f1"}, {key: {"slot_precision", "slot_recall", "slot_f1",
         "support" (references holding the key)}}).
    """
    total = prf(*(sum(r[k] for r in rows) for k in ("slot_tp", "slot_fp", "slot_fn")))
    overall = {f"slot_{k}": v for k, v in total.items()}
    per_key = {}
    for key in keys:
        tp, fp, fn = (sum(r["slots"][key][i] for r in rows) for i in range(3))
        per_key[key] = {**{f"slot_{k}": v for k, v in prf(tp, fp, fn).items()}, "support": tp + fn}
    return overall, per_key
