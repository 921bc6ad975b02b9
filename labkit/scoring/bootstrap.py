"""Paired bootstrap confidence intervals for the card's metrics, overall and per category.

Every metric labkit computes is a weighted function of per-example values, so one bootstrap
resample is a vector of example counts (multinomial weights). Baseline and tuned are resampled with
the *same* weights (the same examples), so the interval of the difference is paired. With all
weights 1 the functions below reproduce `labkit.scoring.metrics.aggregate` exactly (a test checks it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labkit.scoring.metrics import INVALID, RUN_METRICS, _norm, example_key
from labkit.scoring.rouge import ROUGE_TYPES
from labkit.scoring.slots import SLOT_METRICS

# metric name -> the per-example key it averages
MEAN_KEYS = {"json_valid_rate": "json_valid", "field_presence_rate": "field_presence", "field_accuracy": "field_accuracy",
             "exact_match": "exact_match", **{r: r for r in ROUGE_TYPES}, "mean_length_ratio": "length_ratio",
             "stop_rate": "stopped", "mean_answer_tokens": "answer_tokens"}
F1_METRICS = ("accuracy", "macro_f1", "per_category_f1")


class Columns:
    """Per-example columns of one model's scored predictions, aligned on a shared list of example ids."""

    def __init__(self, rows: list[dict[str, Any]], ids: list[str]) -> None:
        by_id = {r["id"]: r for r in rows}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ValueError(f"predictions lack {len(missing)} evaluation example(s), e.g. {missing[0]!r}: "
                             "the runs were not evaluated on the same split")
        ordered = [by_id[i] for i in ids]
        self.gold = np.array([_norm(r["category"]) if r.get("category") is not None else "" for r in ordered])
        self.predicted = np.array([r.get("predicted_category", INVALID) for r in ordered])
        self.values = {k: np.array([float(r[k]) for r in ordered]) for k in MEAN_KEYS.values() if k in ordered[0]}
        self.categories = sorted(set(self.gold.tolist()) - {""})
        with_group = [r.get("group") is not None for r in ordered]
        if any(with_group) and not all(with_group):
            raise ValueError(f"{with_group.count(False)} of {len(ordered)} predictions carry no group (data.fields.group): "
                             "the runs were not evaluated on the same prepared rows; run stage 01 again")
        self.groups = [str(r["group"]) for r in ordered] if all(with_group) else None
        self.slot_keys = list(ordered[0].get("slots") or {})
        if "slot_tp" in ordered[0]:  # (n, 3) counts overall and per declared key
            self.slots = np.array([[r["slot_tp"], r["slot_fp"], r["slot_fn"]] for r in ordered], dtype=float)
            self.per_key = {k: np.array([r["slots"][k] for r in ordered], dtype=float) for k in self.slot_keys}


def weights(n: int, resamples: int, seed: int) -> np.ndarray:
    """Bootstrap weights: row b counts how often each of n examples is drawn in resample b (row 0: all ones)."""
    rng = np.random.default_rng(seed)
    drawn = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(float)
    return np.vstack([np.ones((1, n)), drawn])


def group_weights(groups: list[str], resamples: int, seed: int) -> np.ndarray:
    """Cluster bootstrap weights: each resample draws as many groups as there are, with replacement, and every example
    weighs as often as its group was drawn (row 0: all ones).

    Args:
        groups: each example's group, in the examples' order.
        resamples: bootstrap resamples.
        seed: resampling seed.
    Returns:
        (resamples + 1, n) weights.
    """
    _, first, index = np.unique(np.asarray(groups), return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=int)
    rank[np.argsort(first)] = np.arange(len(first))  # groups numbered in order of appearance: one example per
    drawn = weights(len(first), resamples, seed)  # group draws exactly what `weights` draws for the examples
    return drawn[:, rank[index.ravel()]]


def resample_weights(groups: list[str] | None, n: int, resamples: int, seed: int) -> np.ndarray:
    """`group_weights` when the examples carry groups, else `weights` (one draw per example)."""
    return group_weights(groups, resamples, seed) if groups is not None else weights(n, resamples, seed)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _f1(w: np.ndarray, cols: Columns) -> dict[str, np.ndarray]:
    out = {}
    for cat in cols.categories:
        gold, pred = (cols.gold == cat).astype(float), (cols.predicted == cat).astype(float)
        tp = w @ (gold * pred)
        precision = _ratio(tp, w @ pred)
        recall = _ratio(tp, w @ gold)
        precision, recall = np.nan_to_num(precision), np.nan_to_num(recall)
        out[cat] = np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-300), 0.0)
        out[cat] = np.where(w @ gold > 0, out[cat], np.nan)  # a category absent from a resample has no F1
    return out


def _slot(w: np.ndarray, counts: np.ndarray, name: str) -> np.ndarray:
    tp, fp, fn = (w @ counts[:, i] for i in range(3))
    if name == "slot_precision":
        return np.nan_to_num(_ratio(tp, tp + fp))
    if name == "slot_recall":
        return np.nan_to_num(_ratio(tp, tp + fn))
    return np.nan_to_num(_ratio(2 * tp, 2 * tp + fp + fn))  # = 2PR / (P + R)


def metric(w: np.ndarray, cols: Columns, name: str) -> np.ndarray | dict[str, np.ndarray]:
    """A metric under each row of weights.

    Args:
        w: (resamples, n) example weights.
        cols: per-example columns.
        name: a metric of labkit.scoring.names.METRICS.
    Returns:
        an array of shape (resamples,), or {category: array} for per_category_f1.
    """
    if name in MEAN_KEYS:
        return _ratio(w @ cols.values[MEAN_KEYS[name]], w.sum(axis=1))
    if name in SLOT_METRICS:
        return _slot(w, cols.slots, name)
    if name == "accuracy":
        return _ratio(w @ (cols.gold == cols.predicted).astype(float), w.sum(axis=1))
    f1 = _f1(w, cols)
    if name == "per_category_f1":
        return f1
    if name == "macro_f1":
        return np.nanmean(np.vstack(list(f1.values())), axis=0) if f1 else np.full(len(w), np.nan)
    raise KeyError(f"no bootstrap for metric {name!r}")


def per_category(w: np.ndarray, cols: Columns, name: str) -> dict[str, np.ndarray]:
    """A metric within each reference category: F1 for per_category_f1 and macro_f1, the share answered right
    (the class's recall) for accuracy, slot F1 of the category's examples for the slot metrics, else the mean."""
    if name in ("per_category_f1", "macro_f1"):
        return _f1(w, cols)
    if name == "accuracy":
        right = (cols.gold == cols.predicted).astype(float)
        return {cat: _ratio(w @ (right * (cols.gold == cat)), w @ (cols.gold == cat).astype(float)) for cat in cols.categories}
    if name in SLOT_METRICS:
        return {cat: _slot(w, cols.slots * (cols.gold == cat)[:, None], name) for cat in cols.categories}
    values = cols.values[MEAN_KEYS[name]]
    return {cat: _ratio(w @ (values * (cols.gold == cat)), w @ (cols.gold == cat).astype(float)) for cat in cols.categories}


def interval(samples: np.ndarray, level: float) -> dict[str, float | None]:
    """{value (row 0), low, high}: the percentile interval of the resamples (rows 1…), NaN resamples left out."""
    point, rest = float(samples[0]), samples[1:]
    rest = rest[~np.isnan(rest)]
    if np.isnan(point) or not len(rest):
        return {"value": None if np.isnan(point) else point, "low": None, "high": None}
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(rest, [tail, 100 - tail])
    return {"value": point, "low": float(low), "high": float(high)}


def _aligned(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]]) -> tuple[list[str], Columns, Columns]:
    ids = sorted(r["id"] for r in base_rows)
    base, tuned = Columns(base_rows, ids), Columns(tuned_rows, ids)
    if base.groups != tuned.groups:
        raise ValueError("the two runs' predictions carry different groups (data.fields.group) for the same examples: "
                         "they were not evaluated on the same prepared rows")
    return ids, base, tuned


def paired_intervals(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], names: list[str],
                     resamples: int = 2000, level: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Paired bootstrap intervals of baseline, tuned and their difference for each metric, overall and per category.

    Args:
        base_rows: the baseline's scored predictions (labkit.scoring.metrics.score_predictions rows).
        tuned_rows: the tuned model's, on the same examples.
        names: metric names (primary metric and guardrails).
        resamples: bootstrap resamples.
        level: interval coverage (0.95 → 2.5th and 97.5th percentiles).
        seed: resampling seed (the same seed gives the same intervals).
    Returns:
        {"n", "groups" (the number of groups resampled, None without data.fields.group), "resamples", "level",
         "overall": {metric: {baseline, tuned, diff}},
         "per_category": {metric: {category: {baseline, tuned, diff}}}} where each leaf is {value, low, high};
        per_category_f1 appears under per_category only.
    """
    ids, base, tuned = _aligned(base_rows, tuned_rows)
    w = resample_weights(base.groups, len(ids), resamples, seed)
    out: dict[str, Any] = {"n": len(ids), "groups": len(set(base.groups)) if base.groups else None, "resamples": resamples, "level": level, "overall": {}, "per_category": {},
                           "per_key": {}}

    def triple(b: np.ndarray, t: np.ndarray) -> dict[str, Any]:
        return {"baseline": interval(b, level), "tuned": interval(t, level), "diff": interval(t - b, level)}

    for name in dict.fromkeys(n for n in names if n not in RUN_METRICS):  # run metrics have no examples to resample
        if name != "per_category_f1":
            out["overall"][name] = triple(metric(w, base, name), metric(w, tuned, name))
        if base.categories:
            b_cat, t_cat = per_category(w, base, name), per_category(w, tuned, name)
            out["per_category"][name] = {c: triple(b_cat[c], t_cat[c]) for c in base.categories}
        if name in SLOT_METRICS:
            out["per_key"][name] = {k: triple(_slot(w, base.per_key[k], name), _slot(w, tuned.per_key[k], name))
                                    for k in base.slot_keys}
    return out


def paired_samples(ref_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], name: str,
                   resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """One metric of the reference and the tuned model under the same bootstrap resamples (paired; grouped when the
    rows carry groups), for the verdict's interval and power (`labkit.evaluate.verdict`).

    Args:
        ref_rows: the reference's scored predictions.
        tuned_rows: the tuned model's, on the same examples.
        name: an overall metric (not per_category_f1, not a run metric).
        resamples, seed: the bootstrap.
    Returns:
        {"n", "groups" (None without groups), "reference", "tuned": arrays of shape (resamples + 1,) (index 0: the
        metric on the examples as they are), "diffs": tuned − reference per example when the metric is a mean of
        per-example values (None otherwise)}.
    """
    ids, ref, tuned = _aligned(ref_rows, tuned_rows)
    w = resample_weights(ref.groups, len(ids), resamples, seed)
    diffs = None
    if name in MEAN_KEYS and MEAN_KEYS[name] in ref.values and MEAN_KEYS[name] in tuned.values:
        diffs = tuned.values[MEAN_KEYS[name]] - ref.values[MEAN_KEYS[name]]
    elif name == "accuracy":
        diffs = (tuned.gold == tuned.predicted).astype(float) - (ref.gold == ref.predicted).astype(float)
    return {"n": len(ids), "groups": len(set(ref.groups)) if ref.groups else None, "reference": metric(w, ref, name),
            "tuned": metric(w, tuned, name), "diffs": diffs}


def concentration(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], key: str,
                  top_share: float = 0.10) -> dict[str, Any]:
    """How much of the net per-example gain a few examples, or one category, carry.

    Args:
        base_rows, tuned_rows: scored predictions on the same examples.
        key: the per-example value (e.g. field_accuracy).
        top_share: the share of examples counted as "a few" (the most improved ones).
    Returns:
        {"key", "n", "net_gain", "top_examples", "top_gain", "top_share_of_gain", "gain_by_category",
         "largest_category", "largest_category_share", "flags": [explanations], "statement": one sentence with the
         numbers, saying what was found (or why nothing could be said)}.
    """
    base = {r["id"]: r for r in base_rows}
    diffs = [(float(r[key]) - float(base[r["id"]][key]), r.get("category")) for r in tuned_rows if r["id"] in base]
    net = sum(d for d, _ in diffs)
    k = max(1, int(np.ceil(top_share * len(diffs))))
    top = sum(sorted((d for d, _ in diffs), reverse=True)[:k])
    by_cat: dict[str, float] = {}
    for d, cat in diffs:
        by_cat[str(cat)] = by_cat.get(str(cat), 0.0) + d
    out: dict[str, Any] = {"key": key, "n": len(diffs), "net_gain": net, "top_examples": k, "top_gain": top,
                           "top_share_of_gain": None, "gain_by_category": by_cat, "largest_category": None,
                           "largest_category_share": None, "flags": []}
    if net <= 0:
        out["statement"] = f"no net gain on {key} ({net:+.2f} summed over {len(diffs)} examples): nothing to locate"
        return out
    out["top_share_of_gain"] = top / net
    if top / net >= 0.5:
        out["flags"].append(f"{top / net:.0%} of the net gain comes from the {k} most improved of {len(diffs)} examples")
    largest = max(by_cat, key=by_cat.get)
    out["largest_category"], out["largest_category_share"] = largest, by_cat[largest] / net
    if len(by_cat) > 1 and by_cat[largest] / net >= 0.8:
        out["flags"].append(f"{by_cat[largest] / net:.0%} of the net gain is in one category ({largest})")
    where = (f"; the largest category ({largest}) carries {by_cat[largest] / net:.0%}" if len(by_cat) > 1 else "")
    out["statement"] = (f"net gain {net:+.2f} on {key} over {len(diffs)} examples; the {k} most improved carry "
                        f"{top / net:.0%} of it{where}")
    return out


def concentration_for(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """`concentration` on the per-example value behind a metric; None when it has none (run metrics) or rows lack it."""
    key = example_key(metric)
    if key is None or not tuned_rows or key not in tuned_rows[0] or not base_rows or key not in base_rows[0]:
        return None
    return concentration(base_rows, tuned_rows, key)
