"""Metrics on generated answers: JSON validity, fields and slots, per-class P/R/F1, ROUGE, length; and the run metrics.

Every example is scored on its own (kept as data for paired comparisons: `example_key` names the per-example
value behind each metric), then aggregated overall and per category. Label metrics follow scikit-learn's
definitions: accuracy is the share of exact answers; per-class precision, recall and F1 are
`precision_recall_fscore_support(y_true, y_pred, labels=reference_labels)`; macro-F1 is their unweighted mean over
the labels present in the references. ROUGE and the length ratio: `labkit.scoring.rouge`. The metrics' names and what
each needs: `labkit.scoring.names`. Run metrics (time, throughput, memory, cost) are not computed from answers:
`labkit.stages.run_metrics` reads them from a run's stage 03/04 files.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any, Iterable

from labkit.scoring.names import RUN_METRICS
from labkit.scoring.rouge import ROUGE_TYPES, length_ratio, rouge_scores, settings
from labkit.scoring.slots import aggregate_slots, slot_counts, slot_value

# metric -> the per-example value behind it (the paired view, the concentration check); run metrics have none
EXAMPLE_KEYS = {"json_valid_rate": "json_valid", "field_presence_rate": "field_presence", "field_accuracy": "field_accuracy",
                "slot_precision": "slot_f1", "slot_recall": "slot_f1", "slot_f1": "slot_f1", "accuracy": "correct",
                "macro_f1": "correct", "per_category_f1": "correct", "exact_match": "exact_match", **{r: r for r in ROUGE_TYPES},
                "mean_length_ratio": "length_ratio", "stop_rate": "stopped", "mean_answer_tokens": "answer_tokens"}
# per-example value -> the metric that averages it (where the names differ)
MEAN_NAMES = {"json_valid": "json_valid_rate", "field_presence": "field_presence_rate", "length_ratio": "mean_length_ratio",
              "stopped": "stop_rate", "answer_tokens": "mean_answer_tokens"}
OTHER = "other answer"

INVALID = "<none>"
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def parse_json_answer(text: str) -> tuple[dict[str, Any] | None, bool]:
    """Parse a model answer as a JSON object.

    Args:
        text: the generated answer.
    Returns:
        (object or None, strict) where strict is True only when the whole answer (stripped) is one
        JSON object. A fenced block or an object embedded in prose is still parsed (so fields can be
        scored) but is not strict.
    """
    stripped = text.strip()
    try:
        obj = json.loads(stripped)
        if isinstance(obj, dict):
            return obj, True
    except (json.JSONDecodeError, ValueError):
        pass
    fenced = _FENCE.match(stripped)
    candidates = [fenced.group(1)] if fenced else []
    start = stripped.find("{")
    if start >= 0:
        try:
            obj, _ = json.JSONDecoder().raw_decode(stripped[start:])
            candidates.append(json.dumps(obj))
        except (json.JSONDecodeError, ValueError):
            pass
    for candidate in candidates:
        try:
            obj = json.loads(candidate)
        except (json.JSONDecodeError, ValueError):
            continue
        if isinstance(obj, dict):
            return obj, False
    return None, False


def _norm(value: Any) -> str:
    return " ".join(str(value).split()).casefold()


def score_example(prediction: str, target: str, fmt: dict[str, Any], use_stemmer: bool = True) -> dict[str, Any]:
    """Score one answer against its reference.

    Args:
        prediction: generated text.
        target: reference text (a JSON string for kind json).
        fmt: the card's data.target_format as a dict (kind, required_keys, category_key).
        use_stemmer: stem tokens for ROUGE (the card's eval.rouge.use_stemmer).
    Returns:
        dict of per-example values (json_valid, field_presence, field_accuracy, predicted_category,
        exact_match, rouge1, rouge2, rougeL, rougeLsum, length_ratio).
    """
    out: dict[str, Any] = {"exact_match": float(_norm(prediction) == _norm(target)),
                           **rouge_scores(prediction, target, use_stemmer),
                           "length_ratio": length_ratio(prediction, target)}
    if fmt["kind"] == "json":
        declared = declared_keys(fmt)
        gold, _ = parse_json_answer(target)
        if gold is None:
            raise ValueError(f"reference is not a JSON object: {target[:80]!r}")
        obj, strict = parse_json_answer(prediction)
        obj = obj or {}
        keys = [k for k in declared if gold.get(k) is not None] or list(fmt["required_keys"])  # the reference's keys
        out["json_valid"] = float(strict)
        out["field_presence"] = sum(k in obj for k in keys) / len(keys)
        out["field_accuracy"] = sum(k in obj and slot_value(obj[k]) == slot_value(gold.get(k)) for k in keys) / len(keys)
        out.update(slot_counts(obj, gold, declared))
        key = fmt.get("category_key")
        out["predicted_category"] = _norm(obj[key]) if key and key in obj else INVALID
    elif fmt["kind"] == "label":
        out["predicted_category"] = _norm(prediction) or INVALID
    return out


def declared_keys(fmt: dict[str, Any]) -> list[str]:
    """The JSON keys a card declares: required, then optional."""
    return list(dict.fromkeys([*fmt.get("required_keys", []), *(fmt.get("optional_keys") or [])]))


def known_labels(fmt: dict[str, Any], gold: Iterable[str]) -> list[str]:
    """The label set: the card's target_format.labels when given, else the labels of the references (normalised)."""
    given = fmt.get("labels")
    return sorted({_norm(x) for x in given}) if given else sorted(set(gold))


def per_class_f1(gold: list[str], predicted: list[str], labels: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Precision, recall, F1 and support of each class, as scikit-learn's precision_recall_fscore_support with labels=.

    Args:
        gold: reference labels.
        predicted: predicted labels (may contain labels not in gold, or INVALID: false positives of no class).
        labels: the classes reported (default: the labels of the references).
    Returns:
        {label: {precision, recall, f1, support}}; 0.0 where undefined.
    """
    labels = labels if labels is not None else sorted(set(gold))
    tp: dict[str, int] = defaultdict(int)
    fp: dict[str, int] = defaultdict(int)
    fn: dict[str, int] = defaultdict(int)
    for g, p in zip(gold, predicted, strict=True):
        if g == p:
            tp[g] += 1
        else:
            fn[g] += 1
            fp[p] += 1
    out = {}
    for label in labels:
        precision = tp[label] / (tp[label] + fp[label]) if tp[label] + fp[label] else 0.0
        recall = tp[label] / (tp[label] + fn[label]) if tp[label] + fn[label] else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        out[label] = {"precision": precision, "recall": recall, "f1": f1, "support": tp[label] + fn[label]}
    return out


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def aggregate(rows: list[dict[str, Any]], fmt: dict[str, Any]) -> dict[str, Any]:
    """Aggregate scored examples into overall and per-category metrics.

    Args:
        rows: examples with `category` (reference, may be None) and the keys of `score_example`; rows generated by
            `labkit.evaluate.generation.generate_with_stops` also carry `stopped` and `answer_tokens`, averaged as
            stop_rate and mean_answer_tokens (`labkit.scoring.stopping`).
        fmt: the card's data.target_format as a dict.
    Returns:
        {"n", "overall": {metric: value}, "per_category": {category: {metric: value}}}.
    """
    if not rows:
        raise ValueError("no examples to score (the evaluation split is empty)")
    per_example_keys = [k for k in ("json_valid", "field_presence", "field_accuracy", "exact_match", *ROUGE_TYPES,
                                     "length_ratio", "stopped", "answer_tokens") if k in rows[0]]
    names = MEAN_NAMES
    overall = {names.get(k, k): _mean(r[k] for r in rows) for k in per_example_keys}
    out: dict[str, Any] = {"n": len(rows), "overall": overall, "per_category": {}}
    if "slot_tp" in rows[0]:
        slot_overall, out["per_key"] = aggregate_slots(rows, declared_keys(fmt))
        overall.update(slot_overall)
    per_category: dict[str, dict[str, Any]] = out["per_category"]
    if all(r.get("category") is not None for r in rows):
        gold = [_norm(r["category"]) for r in rows]
        labels = known_labels(fmt, gold)
        present = sorted(set(gold))
        for cat in present:
            members = [r for r, g in zip(rows, gold) if g == cat]
            per_category[cat] = {names.get(k, k): _mean(r[k] for r in members) for k in per_example_keys}
        if "predicted_category" in rows[0]:
            predicted = [r["predicted_category"] for r in rows]
            f1 = per_class_f1(gold, predicted, sorted(set(labels) | set(present)))
            for cat, values in f1.items():
                per_category.setdefault(cat, {}).update(values)
                if values["support"]:  # accuracy within the category is its recall
                    per_category[cat]["accuracy"] = values["recall"]
            overall["accuracy"] = _mean(float(g == p) for g, p in zip(gold, predicted))
            overall["macro_f1"] = _mean(f1[c]["f1"] for c in present)
            out["labels"] = labels
    return out


def score_predictions(rows: list[dict[str, Any]], fmt: dict[str, Any],
                      use_stemmer: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Score a list of predictions.

    Args:
        rows: dicts with id, category, target, prediction.
        fmt: the card's data.target_format as a dict.
        use_stemmer: stem tokens for ROUGE (the card's eval.rouge.use_stemmer).
    Returns:
        (per-example rows with their scores, aggregated metrics; the metrics record the ROUGE settings under "rouge").
        A JSON target whose references never hold `category_key` gets no predicted category, hence no accuracy,
        macro_f1 or per-class F1: its category column only groups the rows.
    """
    scored = [{**r, **score_example(r["prediction"], r["target"], fmt, use_stemmer)} for r in rows]
    key = fmt.get("category_key")
    named = bool(key) and any(key in (parse_json_answer(r["target"])[0] or {}) for r in rows)
    if fmt["kind"] == "json" and not named:
        for row in scored:  # the category is a column only: no answer names it, so no accuracy, F1 or confusion
            row.pop("predicted_category", None)
    for row in scored:
        if row.get("category") is not None and "predicted_category" in row:
            row["correct"] = float(row["predicted_category"] == _norm(row["category"]))
    metrics = aggregate(scored, fmt)
    metrics["rouge"] = settings(use_stemmer)
    return scored, metrics


def example_key(metric: str) -> str | None:
    """The per-example value behind a metric (None for run metrics, which have no per-example value)."""
    return EXAMPLE_KEYS.get(metric)


# the per-example score of a row, first found: the category right or not, JSON field accuracy, text ROUGE-L
SCORE_KEYS = ("correct", "field_accuracy", "rougeL")


def score_key(rows: list[dict[str, Any]]) -> str:
    """The per-example score that example tables and the blind A/B items compare, whatever the primary metric:
    right or not where the rows have a category to predict (a label card; a JSON card with its category key), else
    field accuracy (JSON), else ROUGE-L (text).

    Args:
        rows: scored rows (`score_predictions`); the first one decides.
    Returns:
        the key, one of SCORE_KEYS.
    Raises:
        KeyError: the rows carry none of them (not scored rows).
    """
    found = next((k for k in SCORE_KEYS if k in rows[0]), None)
    if found is None:
        raise KeyError(f"the rows carry no per-example score ({', '.join(SCORE_KEYS)}): are they scored rows?")
    return found


def metric_value(metrics: dict[str, Any], name: str) -> float | dict[str, float]:
    """Look up a metric by name: a float, or {category: f1} for per_category_f1."""
    if name == "per_category_f1":
        return {cat: vals["f1"] for cat, vals in metrics["per_category"].items() if "f1" in vals}
    if name in RUN_METRICS:
        value = (metrics.get("run") or {}).get(name)
        if value is None:
            raise KeyError(f"run metric {name!r} is not available for this model (a base model has no training run)")
        return value
    if name not in metrics["overall"]:
        raise KeyError(f"metric {name!r} was not computed (available: {', '.join(sorted(metrics['overall']))})")
    return metrics["overall"][name]
