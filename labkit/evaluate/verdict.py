"""Judge a tuned run against its baseline: primary metric, guardrails, verdict on the hypothesis."""

from __future__ import annotations

from typing import Any

from labkit.card.schema import Card
from labkit.scoring.metrics import metric_value


def _judge_value(name: str, value: float, base: float | None, rule: dict[str, Any]) -> dict[str, Any]:
    reasons = []
    if rule.get("min") is not None and value < rule["min"]:
        reasons.append(f"{value:.3f} < min {rule['min']}")
    if rule.get("max") is not None and value > rule["max"]:
        reasons.append(f"{value:.3f} > max {rule['max']}")
    if rule.get("max_drop") is not None and base is not None and base - value > rule["max_drop"] + 1e-12:
        reasons.append(f"dropped {base - value:.3f} from {base:.3f} (max_drop {rule['max_drop']})")
    return {"metric": name, "value": value, "baseline": base, "ok": not reasons, "why": "; ".join(reasons)}


def judge_guardrails(card: Card, baseline: dict[str, Any], tuned: dict[str, Any]) -> list[dict[str, Any]]:
    """Judge every guardrail of the card (per category for per_category_f1).

    Args:
        card: the card (experiment.guardrails).
        baseline: baseline metrics (labkit.scoring.metrics.aggregate output).
        tuned: tuned metrics, same shape.
    Returns:
        one row per guardrail (and per category): {"guardrail", "metric", "value", "baseline", "ok", "why"}.
    """
    rows = []
    for rail in card.experiment.guardrails:
        rule = rail.model_dump()
        label = ", ".join(f"{k} {v}" for k, v in rule.items() if k != "metric" and v is not None)
        value = metric_value(tuned, rail.metric)
        base = metric_value(baseline, rail.metric)
        if isinstance(value, dict):
            for cat in sorted(value):
                row = _judge_value(f"{rail.metric}[{cat}]", value[cat], base.get(cat), rule)
                rows.append({"guardrail": f"{rail.metric}: {label}", **row})
        else:
            rows.append({"guardrail": f"{rail.metric}: {label}", **_judge_value(rail.metric, value, base, rule)})
    return rows


def paired(baseline_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], metric: str) -> dict[str, int]:
    """Per-example wins, losses and ties of tuned vs baseline on a per-example metric."""
    base = {r["id"]: r for r in baseline_rows}
    out = {"wins": 0, "losses": 0, "ties": 0}
    key = {"json_valid_rate": "json_valid", "field_presence_rate": "field_presence"}.get(metric, metric)
    for row in tuned_rows:
        if row["id"] not in base or key not in row:
            continue
        diff = row[key] - base[row["id"]][key]
        out["wins" if diff > 0 else "losses" if diff < 0 else "ties"] += 1
    return out


def verdict(card: Card, baseline: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    """The decision of the experiment on the validation split.

    Args:
        card: the card (hypothesis, target, guardrails).
        baseline: baseline metrics.
        tuned: tuned metrics.
    Returns:
        {"primary": {...}, "guardrails": [...], "confirmed": bool, "verdict": str}.
    """
    target = card.experiment.target
    base = metric_value(baseline, target.primary_metric)
    value = metric_value(tuned, target.primary_metric)
    gain = value - base
    primary = {"metric": target.primary_metric, "baseline": base, "tuned": value, "gain": gain,
               "min_improvement": target.min_improvement, "ok": gain >= target.min_improvement - 1e-12}
    rails = judge_guardrails(card, baseline, tuned)
    failed = [r for r in rails if not r["ok"]]
    confirmed = primary["ok"] and not failed
    if confirmed:
        text = (f"CONFIRMED: {target.primary_metric} {base:.3f} → {value:.3f} (gain {gain:+.3f} ≥ {target.min_improvement}), "
                f"all {len(rails)} guardrail checks pass.")
    else:
        parts = []
        if not primary["ok"]:
            parts.append(f"{target.primary_metric} gain {gain:+.3f} < required {target.min_improvement}")
        parts += [f"{r['metric']} {r['why']}" for r in failed]
        text = "NOT CONFIRMED: " + "; ".join(parts) + "."
    return {"primary": primary, "guardrails": rails, "confirmed": confirmed, "verdict": text}
