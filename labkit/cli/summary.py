"""What `labkit run` says about a finished run: the registry's summary, the budget stop, and the verdict line that
ends each card's output (one line per card again at the very end when several ran)."""

from __future__ import annotations

from typing import Any

from labkit.core import io
from labkit.core import runs as R
from labkit.core.comparability import budget_note, steps_text, training_steps
from labkit.evaluate.verdict_text import verdict_line
from labkit.stages.records import PAIRED, VERDICT


def registry_summary(run: R.Run) -> dict[str, Any]:
    """The `summary` of the registry's `completed` event: confirmed, the decision, the primary metric's reference
    and tuned values (from comparison/verdict.json; {} when stage 05 did not run).

    Args:
        run: the run.
    Returns:
        {"confirmed", "decision", <metric>: {"baseline", "tuned"}} or {}.
    """
    path = run.dir / "comparison" / VERDICT
    if not path.exists():
        return {}
    verdict = io.read_json(path)
    primary = verdict["primary"]
    ref, tuned = primary.get("reference", primary.get("baseline")), primary.get("tuned")  # against the card's reference
    return {"confirmed": verdict["confirmed"], "decision": verdict.get("decision"),
            primary["metric"]: {"baseline": None if ref is None else round(ref, 4),
                                "tuned": None if tuned is None else round(tuned, 4)}}


def budget_stop(run: R.Run) -> dict[str, Any]:
    """{"stopped_by": "budget", "note"} when training stopped on budget.max_minutes (training/outcome.json says so,
    as training wrote it), else {}.

    Args:
        run: the run.
    Returns:
        the keys the registry's `completed` event carries for a budget stop.
    """
    steps = training_steps(run.dir)
    if not steps["budget_stopped"]:
        return {}
    return {"stopped_by": "budget", "note": f"training stopped by budget.max_minutes after {steps_text(steps)} "
                                            "step(s); a checkpoint was written"}


def verdict_summary(run: R.Run) -> str:
    """The run's verdict line: `verdict <experiment>/<variant>: NOT CONFIRMED · field_accuracy 0.100 → 0.150 (gain
    …) · 3 wins / 1 losses / 8 ties · guardrails 2/3 pass · budget-stopped at 8/24 steps`.

    Args:
        run: the run.
    Returns:
        the line (without a verdict: what the run's status is instead).
    """
    head = f"verdict {run.experiment}/{run.status().get('variant') or run.run_id}: "
    path = run.dir / "comparison" / VERDICT
    note = budget_note(training_steps(run.dir))
    if not path.exists():
        return head + f"none ({R.status_label(run.status())}; stage 05 did not run)" + (f" · {note}" if note else "")
    decision = io.read_json(path)
    paired = run.dir / "comparison" / PAIRED
    pairs = io.read_json(paired) if paired.exists() and decision.get("against") == "baseline" else None
    return head + verdict_line(decision, pairs, note)
