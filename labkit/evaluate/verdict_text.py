"""The sentences of a verdict (`labkit.evaluate.verdict`): the gain with its interval and n, the smallest gain the
evaluation could detect, and how often the answers stopped."""

from __future__ import annotations

from typing import Any

from labkit.evaluate.power import POWER


def interval_text(p: Any) -> str:
    """"gain +0.578, 95% interval [+0.517, +0.639] on n = 60 examples" (or a run metric's point rule)."""
    if p.get("rule") == "point":
        return f"{p['metric']} is a run metric, one number per run: judged on that number, without an interval"
    groups = f" in {p['groups']} groups" if p.get("groups") else ""
    if p.get("gain_low") is None:
        return f"n = {p.get('n')} examples{groups}"
    return (f"gain {p['gain']:+.3f}, {p['level'] * 100:g}% interval [{p['gain_low']:+.3f}, {p['gain_high']:+.3f}] on "
            f"n = {p['n']} examples{groups}")


def detectable_text(p: Any) -> str:
    """"the smallest gain n = 60 examples detect with 80% power is +0.391" (empty without it)."""
    if p.get("detectable_gain") is None:
        return ""
    return f"the smallest gain n = {p['n']} examples detect with {POWER:.0%} power is {p['detectable_gain']:+.3f}"


def stopping_text(reference: dict[str, Any] | None, tuned: dict[str, Any] | None) -> str:
    """"stop_rate 0.00 → 1.00 (answers that ended before eval.max_new_tokens)", or "" when either side has none (a
    label card's metrics have it too, answers generated before labkit recorded stopping do not)."""
    ref, value = ((m or {}).get("overall", m or {}).get("stop_rate") for m in (reference, tuned))
    if ref is None or value is None:
        return ""
    return f"stop_rate {ref:.2f} → {value:.2f} (answers that ended before eval.max_new_tokens)"


def verdict_line(decision: Any, pairs: dict[str, Any] | None = None, budget: str = "", width: int = 110) -> str:
    """A run's result in one line, for the end of `labkit run`: the decision word, the primary metric reference →
    tuned with its interval (`interval_text`), wins / losses / ties, the guardrails, a budget stop.

    Args:
        decision: a `labkit.evaluate.verdict.Verdict` (comparison/verdict.json).
        pairs: comparison/paired.json ({"key", "wins", "losses", "ties"}) or None.
        budget: "budget-stopped at 8/24 steps" (`labkit.core.comparability.budget_note`) or "".
        width: where the reason of a NOT JUDGED verdict is cut (…).
    Returns:
        e.g. "NOT CONFIRMED · field_accuracy 0.100 → 0.150 (gain +0.050, 95% interval [-0.050, +0.150] on n = 12
        examples) · 3 wins / 1 loss / 8 ties · guardrails 2/3 pass, failing: json_valid_rate · budget-stopped at
        8/24 steps".
    """
    p = decision["primary"]
    word = str(decision.get("decision") or ("confirmed" if decision.get("confirmed") else "not confirmed")).upper()
    parts = [word]
    if decision.get("decision") == "not judged":
        why = decision["verdict"].split(":", 1)[-1].strip()
        parts.append(why if len(why) <= width else why[: width - 1] + "…")
    else:
        ref, tuned = p.get("reference", p.get("baseline")), p.get("tuned")
        shown = " → ".join("—" if v is None else f"{v:.3f}" for v in (ref, tuned))
        who = "" if decision.get("against", "baseline") == "baseline" else f" against {decision['against']}"
        interval = "" if p.get("rule") == "point" else f" ({interval_text(p)})"
        parts.append(f"{p['metric']} {shown}{who}{interval}")
        if pairs and pairs.get("key"):
            parts.append(f"{pairs['wins']} wins / {pairs['losses']} losses / {pairs['ties']} ties")
        rails = decision.get("guardrails") or []
        failed = [g["metric"] for g in rails if not g["ok"]]
        parts.append(f"guardrails {len(rails) - len(failed)}/{len(rails)} pass"
                     + (f", failing: {', '.join(failed)}" if failed else "") if rails else "no guardrails")
    if budget:
        parts.append(budget)
    return " · ".join(parts)
