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
