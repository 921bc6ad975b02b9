"""Where the tuned model falls short, for the model card's "Observed limits": each metric judged in its good direction.

The direction is the verdict's (`labkit.evaluate.verdict.higher_is_better`: higher is better except time, memory and
cost); the two-sided metrics of `labkit.scoring.names.TWO_SIDED` have none. Of those, `mean_length_ratio` (answer
words / reference words) is judged by its distance from 1, the reference's own length: 4.4 → 1.0 is an improvement;
`mean_answer_tokens` has no reference value per category and is not judged.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from labkit.core import io
from labkit.core import runs as R
from labkit.data.lengths import length_stats
from labkit.data.prepare import load_split
from labkit.data.prompting import encode_rows
from labkit.evaluate.verdict import higher_is_better
from labkit.scoring.names import TWO_SIDED

PER_EXAMPLE = {"json_valid_rate": "json_valid", "field_presence_rate": "field_presence"}
# two-sided metrics with a known right value: the distance from it is what is judged (lower is better)
TARGET_VALUE = {"mean_length_ratio": 1.0}
RATIO_FLOOR = 1e-3  # a ratio of 0 (empty answers) is as far as 1000× too short: finite, farther than any real answer
# per-category keys that are counts, not scores
NOT_SCORES = ("support",)


def read_if_present(path: Path) -> Any:
    """A run file's content (JSON, or JSON lines for .jsonl), None when it is absent."""
    if not path.exists():
        return None
    if path.suffix == ".jsonl":
        return io.read_jsonl(path)
    return io.read_json(path)


def judged_change(metric: str, baseline: float, tuned: float) -> float | None:
    """How much better the tuned value is than the baseline's, in the metric's good direction.

    Args:
        metric: the metric's name (a per-category key such as "f1" or "field_accuracy" is higher-is-better).
        baseline: the base model's value.
        tuned: the tuned model's value.
    Returns:
        the improvement (negative: worse); for `mean_length_ratio` the shrinking of |log ratio| (closer to the
        reference's length is better: 4.4 → 1.0 is positive; empty answers, 0, are the farthest); None for a metric without a direction or target.
    """
    if metric in TARGET_VALUE:
        target = TARGET_VALUE[metric]

        def distance(value: float) -> float:  # |log(value / target)|; empty answers (0) as 1000× too short
            return abs(math.log(max(value, RATIO_FLOOR * target) / target))

        return distance(baseline) - distance(tuned)
    if metric in TWO_SIDED or metric in NOT_SCORES:
        return None
    return (tuned - baseline) if higher_is_better(metric) else (baseline - tuned)


def worse_categories(baseline: dict[str, Any] | None, tuned: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The per-category values where the tuned model is worse than the base, each metric in its good direction.

    Args:
        baseline: the base model's metrics (`per_category`).
        tuned: the tuned model's metrics.
    Returns:
        rows {"category", "metric", "baseline", "tuned", "drop"}; drop is the worsening in the good direction (for
        mean_length_ratio: the growth of |log ratio|).
    """
    if not baseline or not tuned:
        return []
    out = []
    for cat, values in sorted((tuned.get("per_category") or {}).items()):
        base = (baseline.get("per_category") or {}).get(cat, {})
        for metric, value in values.items():
            if metric not in base or not isinstance(value, (int, float)) or not isinstance(base[metric], (int, float)):
                continue
            change = judged_change(metric, base[metric], value)
            if change is not None and change < -1e-12:
                out.append({"category": cat, "metric": metric, "baseline": base[metric], "tuned": value,
                            "drop": -change})
    return out


def _weakest_categories(tuned: dict[str, Any] | None, metric: str) -> list[dict[str, Any]]:
    """Categories below the tuned model's overall level on the primary metric (or F1), weakest first."""
    cats = (tuned or {}).get("per_category") or {}
    key = next((k for k in (metric, "field_accuracy", "f1") if cats and all(k in v for v in cats.values())), None)
    overall = ((tuned or {}).get("overall") or {}).get(key if key != "f1" else "macro_f1")
    if key is None or overall is None:
        return []
    rows = [{"category": c, "metric": key, "tuned": v[key], "overall": overall, "f1": v.get("f1")}
            for c, v in cats.items() if v[key] < overall - 1e-12]
    return sorted(rows, key=lambda r: r["tuned"])


def _example_key(metric: str, row: dict[str, Any]) -> str:
    key = PER_EXAMPLE.get(metric, metric)
    if key in row:
        return key
    return next((k for k in ("field_accuracy", "rougeL", "exact_match") if k in row), key)


def failure_examples(run_dir: Path, metric: str, n: int = 3) -> list[dict[str, Any]]:
    """The tuned predictions with the lowest per-example score on the primary metric (regressions first among ties).

    Args:
        run_dir: the run folder.
        metric: the card's primary metric.
        n: how many.
    Returns:
        rows {"id", "category", "metric", "tuned", "baseline", "target", "prediction", "baseline_prediction"}.
    """
    tuned = read_if_present(run_dir / "comparison" / "tuned_predictions.jsonl") or []
    base = {r["id"]: r for r in read_if_present(run_dir / "baseline" / "baseline_predictions.jsonl") or []}
    if not tuned:
        return []
    key = _example_key(metric, tuned[0])
    if key not in tuned[0]:
        return []

    def base_score(row: dict[str, Any]) -> float:
        return float(base.get(row["id"], {}).get(key, 0.0))

    worst = sorted(tuned, key=lambda r: (r[key], -(base_score(r) - r[key]), r["id"]))[:n]
    return [{"id": r["id"], "category": r.get("category"), "metric": key, "tuned": r[key], "baseline": base_score(r),
             "target": r["target"], "prediction": r["prediction"][:300],
             "baseline_prediction": base.get(r["id"], {}).get("prediction", "")[:300]} for r in worst]


def truncation(run_dir: Path, card: Any, tokenizer: Any = None) -> dict[str, Any]:
    """How much of the data max_length cut, and what the cleaning rules dropped for length.

    Read from stage 02's preprocessing/lengths.json; computed from the prepared train and validation
    splits with the tokenizer when that file is absent.

    Args:
        run_dir: the run folder.
        card: the card (max_length, prompt).
        tokenizer: the tokenizer, for computing lengths when stage 02 recorded none.
    Returns:
        {"max_length", "source", "per_split": {split: {rows, max, truncated_rate, completion_cut_rate}},
        "dropped_for_length": [{"rule", "removed"}]}.
    """
    stats = read_if_present(run_dir / "preprocessing" / "lengths.json")
    source = "preprocessing/lengths.json"
    if stats is None and tokenizer is not None:
        run = R.Run(run_dir)
        stats = length_stats(card, {s: encode_rows(tokenizer, card, load_split(run, s)) for s in ("train", "validation")})
        source = "computed at export from data/ and the exported tokenizer"
    manifest = read_if_present(run_dir / "data_manifest.json") or {}
    dropped = [{"rule": step["rule"], "removed": step["removed"]} for step in manifest.get("cleaning", [])
               if isinstance(step.get("rule"), dict) and any(k.startswith("drop_longer_than") for k in step["rule"])]
    per_split = {s: {k: v.get(k) for k in ("rows", "max", "truncated_rate", "completion_cut_rate")}
                 for s, v in (stats or {}).items()}
    return {"max_length": card.data.max_length, "source": source if stats is not None else None,
            "per_split": per_split, "dropped_for_length": dropped}


def observed_limits(run_dir: Path, card: Any, results: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
    """Where the tuned model is known to fall short.

    Args:
        run_dir: the run folder.
        card: the card.
        results: `collect_results(run_dir)`.
        tokenizer: the exported tokenizer (only used when stage 02 recorded no lengths).
    Returns:
        {"categories_worse", "weakest_categories", "guardrails_failed", "primary_not_met", "truncation",
        "failure_examples", "evaluated_on"}.
    """
    limits: dict[str, Any] = {"categories_worse": {}, "weakest_categories": {}, "guardrails_failed": {}, "primary_not_met": {}}
    for split in ("validation", "test"):
        res = results.get(split)
        if not res:
            continue
        limits["categories_worse"][split] = worse_categories(res.get("baseline"), res.get("tuned"))
        limits["weakest_categories"][split] = _weakest_categories(res.get("tuned"), card.experiment.target.primary_metric)
        verdict = res.get("verdict") or {}
        limits["guardrails_failed"][split] = [g for g in verdict.get("guardrails", []) if not g.get("ok")]
        if verdict.get("primary") and not verdict["primary"].get("ok"):
            limits["primary_not_met"][split] = verdict["primary"]
    limits["truncation"] = truncation(run_dir, card, tokenizer)
    limits["failure_examples"] = failure_examples(run_dir, card.experiment.target.primary_metric)
    limits["evaluated_on"] = {s: (results[s] or {}).get("tuned", {}).get("n") for s in ("validation", "test") if results.get(s)}
    return limits
