"""Judge a tuned run against its reference: primary metric, guardrails, verdict on the hypothesis.

The reference is the base model (`experiment.target.against: baseline`) or the latest completed run of another
variant of the same experiment (`against: <variant>`). A per-example primary metric is decided on the paired
bootstrap interval of its gain (`labkit.evaluate.power`): CONFIRMED when the interval's worse end clears the target,
INCONCLUSIVE when only the point estimate does (with the examples that would settle it). Run metrics (time,
throughput, memory, cost: `labkit.stages.run_metrics`, passed in under "run") have one number per run and are judged
on it; guardrails are judged on the point values, each metric in its good direction. The decision is a `Verdict`
(comparison/verdict.json, final/verdict.json): its `primary` check and one `GuardrailCheck` per guardrail (and
category). docs/deciding.md gives the method.
"""

from __future__ import annotations

from typing import Any, TypedDict

from labkit.card.schema import Card
from labkit.evaluate.power import POWER, gain_statistics
from labkit.evaluate.verdict_text import detectable_text, interval_text, stopping_text
from labkit.scoring.metrics import RUN_METRICS, example_key, metric_value

# the default guardrail's floor on the tuned stop_rate, when the reference stops more often (`default_stop_check`)
DEFAULT_STOP_RATE = 0.95


class GuardrailCheck(TypedDict):
    """One guardrail judged (per category for per_category_f1)."""

    guardrail: str  # the rule as the card says it, e.g. "json_valid_rate: max_drop 0.05"
    metric: str  # the metric, with [category] for a per-category value
    value: float | None
    reference: float | None
    ok: bool
    why: str  # empty when ok


class PrimaryCheck(TypedDict, total=False):
    """The primary metric judged against the reference (a run not judged yet has metric, ok, reference, baseline and
    tuned only)."""

    metric: str
    against: str
    reference: float | None
    tuned: float | None
    baseline: float | None
    gain: float | None  # in the metric's good direction
    ratio: float | None
    min_improvement: float | None
    max_ratio: float | None
    min_ratio: float | None
    ok: bool
    why: str
    rule: str  # "interval" (a per-example metric: decided on its interval) or "point" (a run metric)
    point_ok: bool  # the point estimate clears the target
    n: int | None  # examples evaluated (None for a run metric)
    groups: int | None  # groups resampled (data.fields.group), None when examples are resampled one by one
    level: float | None  # the interval's level
    gain_low: float | None  # the interval of the gain, in the metric's good direction
    gain_high: float | None
    ratio_low: float | None  # the interval of tuned / reference
    ratio_high: float | None
    sd: float | None  # per-example standard deviation of the paired difference (labkit.evaluate.power)
    detectable_gain: float | None  # the smallest gain n examples confirm with 80 % power
    examples_needed: int | None  # examples giving 80 % power to confirm the observed gain (None: gain ≤ threshold)


DECISIONS = ("confirmed", "inconclusive", "not confirmed", "not judged")


class Verdict(TypedDict):
    """The decision on the hypothesis (comparison/verdict.json; final/verdict.json on the test split)."""

    against: str  # "baseline" or a variant
    reference_run: str | None  # the reference variant's run
    primary: PrimaryCheck
    guardrails: list[GuardrailCheck]
    confirmed: bool  # decision == "confirmed"
    decision: str  # one of DECISIONS
    verdict: str  # the sentence: CONFIRMED / INCONCLUSIVE / NOT CONFIRMED / NOT JUDGED …, with n, interval, detectable gain


def higher_is_better(name: str) -> bool:
    """Whether a larger value of the metric is an improvement (False for time, memory and cost)."""
    return RUN_METRICS.get(name, True)


def _value(metrics: dict[str, Any] | None, name: str) -> Any:
    if metrics is None:
        return None
    try:
        return metric_value(metrics, name)
    except KeyError:
        return None


def _check_value(name: str, value: float | None, ref: float | None, rule: dict[str, Any]) -> dict[str, Any]:
    reasons = []
    if value is None:
        reasons.append("not available for this run")
    else:
        sign = 1 if higher_is_better(name.split("[")[0]) else -1
        if rule.get("min") is not None and value < rule["min"]:
            reasons.append(f"{value:.3f} < min {rule['min']}")
        if rule.get("max") is not None and value > rule["max"]:
            reasons.append(f"{value:.3f} > max {rule['max']}")
        relative = [k for k in ("max_drop", "max_ratio", "min_ratio") if rule.get(k) is not None]
        if relative and ref is None:
            reasons.append(f"{relative[0]}: the reference has no {name}")
        elif ref is not None:
            drop = sign * (ref - value)
            if rule.get("max_drop") is not None and drop > rule["max_drop"] + 1e-12:
                reasons.append(f"worse by {drop:.3f} than the reference's {ref:.3f} (max_drop {rule['max_drop']})")
            ratio = value / ref if ref else None
            if rule.get("max_ratio") is not None and (ratio is None or ratio > rule["max_ratio"] + 1e-12):
                reasons.append(f"{value:.3f} / {ref:.3f} = {ratio:.3f} > max_ratio {rule['max_ratio']}" if ratio is not None
                               else "max_ratio: the reference's value is 0")
            if rule.get("min_ratio") is not None and (ratio is None or ratio < rule["min_ratio"] - 1e-12):
                reasons.append(f"{value:.3f} / {ref:.3f} = {ratio:.3f} < min_ratio {rule['min_ratio']}" if ratio is not None
                               else "min_ratio: the reference's value is 0")
    return {"metric": name, "value": value, "reference": ref, "ok": not reasons, "why": "; ".join(reasons)}


def guardrail_checks(card: Card, reference: dict[str, Any], tuned: dict[str, Any]) -> list[GuardrailCheck]:
    """Check every guardrail of the card against the reference (per category for per_category_f1).

    Args:
        card: the card (experiment.guardrails).
        reference: the reference's metrics (labkit.scoring.metrics.aggregate output; run metrics under "run").
        tuned: tuned metrics, same shape.
    Returns:
        one row per guardrail (and per category): {"guardrail", "metric", "value", "reference", "ok", "why"}; a text or
        JSON card without a stop_rate guardrail gets the default one first (`default_stop_check`).
    """
    rows: list[GuardrailCheck] = [*default_stop_check(card, reference, tuned)]
    for rail in card.experiment.guardrails:
        rule = rail.model_dump()
        label = ", ".join(f"{k} {v}" for k, v in rule.items() if k != "metric" and v is not None)
        value, ref = _value(tuned, rail.metric), _value(reference, rail.metric)
        if isinstance(value, dict):
            for cat in sorted(value):
                row = _check_value(f"{rail.metric}[{cat}]", value[cat], (ref or {}).get(cat), rule)
                rows.append({"guardrail": f"{rail.metric}: {label}", **row})
        else:
            rows.append({"guardrail": f"{rail.metric}: {label}", **_check_value(rail.metric, value, ref, rule)})
    return rows


def default_stop_check(card: Card, reference: dict[str, Any], tuned: dict[str, Any]) -> list[GuardrailCheck]:
    """The default guardrail of text and JSON cards: the tuned model's stop_rate does not fall below the reference's
    or DEFAULT_STOP_RATE, whichever is lower (a tuned model that stops less often than it should has learned to
    ramble to eval.max_new_tokens; a base model that rarely stopped does not set the bar above what it did).

    Label cards get none (their answers are a word), nor does a card that declares its own stop_rate guardrail (it
    replaces the default), nor a run whose answers, or its reference's, were generated before labkit recorded
    stopping (no stop_rate to judge).

    Args:
        card: the card (data.target_format.kind, experiment.guardrails, experiment.target.against).
        reference: the reference's metrics (the base model's, or the sibling variant's).
        tuned: the tuned metrics.
    Returns:
        [] or one row {"guardrail": "stop_rate: default (≥ min(base, 0.95))", "metric": "stop_rate", "value",
        "reference", "ok", "why"}.
    """
    if card.data.target_format.kind == "label" or any(g.metric == "stop_rate" for g in card.experiment.guardrails):
        return []
    value, ref = _value(tuned, "stop_rate"), _value(reference, "stop_rate")
    if value is None or ref is None:
        return []
    who = "base" if card.experiment.target.against == "baseline" else card.experiment.target.against
    bound = min(ref, DEFAULT_STOP_RATE)
    ok = value >= bound - 1e-12
    why = "" if ok else (f"{value:.3f} < {bound:.3f} = min({who} {ref:.3f}, {DEFAULT_STOP_RATE}): more answers ran to "
                         "eval.max_new_tokens than the reference's (see stage 02's end-token check)")
    return [{"guardrail": f"stop_rate: default (≥ min({who}, {DEFAULT_STOP_RATE}))", "metric": "stop_rate",
             "value": value, "reference": ref, "ok": ok, "why": why}]


def paired(reference_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], metric: str) -> dict[str, Any]:
    """Per-example wins, losses and ties of tuned vs the reference on the per-example value behind a metric.

    Returns:
        {"key" (the per-example value compared, None for run metrics), "wins", "losses", "ties"}.
    """
    key = example_key(metric)
    base = {r["id"]: r for r in reference_rows}
    out: dict[str, Any] = {"key": key, "wins": 0, "losses": 0, "ties": 0}
    for row in tuned_rows if key else []:
        if row["id"] not in base or key not in row or key not in base[row["id"]]:
            continue
        diff = row[key] - base[row["id"]][key]
        out["wins" if diff > 0 else "losses" if diff < 0 else "ties"] += 1
    return out


def _point(card: Card, ref: float, value: float, out: PrimaryCheck) -> list[str]:
    """The target's rules on the point values; fills gain and ratio; returns what fails."""
    target, name = card.experiment.target, card.experiment.target.primary_metric
    out["gain"] = (value - ref) if higher_is_better(name) else (ref - value)
    out["ratio"] = value / ref if ref else None
    reasons = []
    if target.min_improvement is not None and out["gain"] < target.min_improvement - 1e-12:
        reasons.append(f"{name} gain {out['gain']:+.3f} < required {target.min_improvement}")
    for key, bad in (("max_ratio", lambda r, x: r > x + 1e-12), ("min_ratio", lambda r, x: r < x - 1e-12)):
        bound = getattr(target, key)
        if bound is not None and (out["ratio"] is None or bad(out["ratio"], bound)):
            reasons.append(f"{name} {value:.3f} / {ref:.3f} = {out['ratio'] or float('nan'):.3f}, {key} {bound}")
    return reasons


def _interval_reasons(card: Card, out: PrimaryCheck) -> list[str]:
    """The target's rules on the interval's worse end (the gain's low end; the ratio's end against each bound)."""
    target, name = card.experiment.target, card.experiment.target.primary_metric
    level = f"{out['level'] * 100:g}%"
    if out["gain_low"] is None:
        return [f"{name} has no {level} interval on {out['n']} example(s)"]
    reasons = []
    if target.min_improvement is not None and out["gain_low"] < target.min_improvement - 1e-12:
        reasons.append(f"{name} gain {out['gain']:+.3f} clears the required {target.min_improvement} but its {level} "
                       f"interval [{out['gain_low']:+.3f}, {out['gain_high']:+.3f}] does not")
    for key, end, bad in (("max_ratio", "ratio_high", lambda r, x: r > x + 1e-12),
                          ("min_ratio", "ratio_low", lambda r, x: r < x - 1e-12)):
        bound = getattr(target, key)
        if bound is not None and (out[end] is None or bad(out[end], bound)):  # type: ignore[literal-required]
            reasons.append(f"{name} ratio {out['ratio'] or float('nan'):.3f} meets {key} {bound} but its {level} "
                           f"interval [{out['ratio_low'] or float('nan'):.3f}, {out['ratio_high'] or float('nan'):.3f}]"
                           " does not")
    return reasons


def _primary(card: Card, reference: dict[str, Any], tuned: dict[str, Any], stats: dict[str, Any] | None) -> PrimaryCheck:
    """The primary check: the point rule for a run metric, the interval rule (on `stats`) otherwise."""
    target = card.experiment.target
    name = target.primary_metric
    ref, value = _value(reference, name), _value(tuned, name)
    out: PrimaryCheck = {"metric": name, "against": target.against, "reference": ref, "tuned": value, "gain": None,
                         "ratio": None, "min_improvement": target.min_improvement, "max_ratio": target.max_ratio,
                         "min_ratio": target.min_ratio, "rule": "point" if name in RUN_METRICS else "interval",
                         "point_ok": False, **{k: None for k in _STATS}}  # type: ignore[typeddict-item]
    if value is None or ref is None:
        out.update(ok=False, why=f"{name} is not available for {'the reference' if ref is None else 'this run'}")
        return out
    out.update({k: v for k, v in (stats or {}).items() if k in _STATS})  # type: ignore[typeddict-item]
    reasons = _point(card, ref, value, out)
    out["point_ok"] = not reasons
    if not reasons and out["rule"] == "interval":
        reasons = _interval_reasons(card, out) if stats is not None else ["no paired interval"]
    out.update(ok=not reasons, why="; ".join(reasons))
    return out


_STATS = ("n", "groups", "level", "gain_low", "gain_high", "ratio_low", "ratio_high", "sd", "detectable_gain",
          "examples_needed")


def verdict(card: Card, baseline: dict[str, Any], tuned: dict[str, Any],
            reference: dict[str, Any] | None = None, reference_run: str | None = None, *,
            reference_rows: list[dict[str, Any]] | None = None, tuned_rows: list[dict[str, Any]] | None = None,
            resamples: int = 2000, level: float = 0.95, seed: int = 0) -> Verdict:
    """The decision of the experiment on the evaluated split.

    Args:
        card: the card (hypothesis, target, guardrails).
        baseline: the base model's metrics.
        tuned: tuned metrics (run metrics under "run").
        reference: the reference's metrics when target.against names a variant (None: the baseline is the reference).
        reference_run: the reference run's id (against a variant), for the text.
        reference_rows: the reference's scored predictions (the baseline's, or the reference variant's tuned ones);
            needed, with tuned_rows, for a per-example primary metric.
        tuned_rows: this run's scored predictions on the same examples.
        resamples, level, seed: the paired bootstrap of the gain (grouped when the rows carry groups).
    Returns:
        the Verdict: decision "confirmed" (the interval's worse end clears the target; a run metric: its value does),
        "inconclusive" (only the point estimate does), "not confirmed" or "not judged".
    """
    target = card.experiment.target
    name = target.primary_metric
    against_variant = target.against != "baseline"
    per_example = name not in RUN_METRICS
    missing = None
    if against_variant and reference is None:
        missing = (f"the hypothesis is against variant {target.against!r}, which has no completed run in this "
                   "experiment yet; run that card, then `labkit compare` judges this run again")
    elif per_example and (reference_rows is None or tuned_rows is None):
        missing = (f"{name} is decided on the paired interval of its gain, which needs the per-example predictions of "
                   "the reference and of this run")
    ref = reference if against_variant else baseline
    stats = None
    if not missing and per_example and _value(ref, name) is not None and _value(tuned, name) is not None:
        try:
            stats = gain_statistics(reference_rows or [], tuned_rows or [], name, higher_is_better(name),
                                    target.min_improvement, resamples, level, seed)
        except ValueError as exc:  # not the same examples: no paired interval
            missing = f"{name} is decided on the paired interval of its gain, and {exc}"
    if missing:
        primary: PrimaryCheck = {"metric": name, "ok": False, "reference": None,
                                 "baseline": _value(baseline, name), "tuned": _value(tuned, name)}
        return {"against": target.against, "reference_run": None, "primary": primary, "guardrails": [],
                "confirmed": False, "decision": "not judged", "verdict": f"NOT JUDGED: {missing}."}
    primary = _primary(card, ref, tuned, stats)
    primary["baseline"] = _value(baseline, name)
    rails = guardrail_checks(card, ref, tuned)
    failed = [r for r in rails if not r["ok"]]
    decision = ("confirmed" if primary["ok"] and not failed else
                "inconclusive" if primary.get("point_ok") and not failed else "not confirmed")
    who = f"variant {target.against} (run {reference_run})" if against_variant else "the baseline"
    interval, detectable = interval_text(primary), detectable_text(primary)
    rails_ok = f"all {len(rails)} guardrail checks pass" if rails else "no guardrails to check"
    stops = stopping_text(ref, tuned)
    tail = (f"; {detectable}" if detectable else "") + (f"; {stops}" if stops else "") + f"; {rails_ok}."
    if decision == "confirmed":
        rules = "; ".join(f"{k} {v}" for k, v in (("gain ≥", target.min_improvement), ("ratio ≤", target.max_ratio),
                                                    ("ratio ≥", target.min_ratio)) if v is not None)
        head = f"CONFIRMED against {who}: {name} {primary['reference']:.3f} → {primary['tuned']:.3f}"
        text = (f"{head} ({rules}; {interval}), {rails_ok}." if primary["rule"] == "point" else
                f"{head}, {interval}: its worse end meets {rules}" + tail)
    elif decision == "inconclusive":
        needed = primary.get("examples_needed")
        groups = f" in {primary['groups']} groups" if primary.get("groups") else ""
        sized = " (in groups of the same sizes)" if groups else ""
        settle = (f"; about {needed} examples{sized} would give {POWER:.0%} power to confirm a gain of "
                  f"{primary['gain']:+.3f}" if needed else "")
        text = f"INCONCLUSIVE against {who}: {primary['why']} (n = {primary['n']} examples{groups}){settle}" + tail
    else:
        parts = [primary["why"]] if not primary["ok"] and primary["why"] else []
        parts += [f"{r['metric']} {r['why']}" for r in failed]
        evidence = "; ".join(x for x in (interval if primary.get("n") or primary.get("rule") == "point" else "",
                                         detectable, stops) if x)
        text = f"NOT CONFIRMED against {who}: " + "; ".join(parts) + (f" ({evidence})." if evidence else ".")
    return {"against": target.against, "reference_run": reference_run, "primary": primary, "guardrails": rails,
            "confirmed": decision == "confirmed", "decision": decision, "verdict": text}
