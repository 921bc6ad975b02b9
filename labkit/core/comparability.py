"""Whether two runs trained comparably: the one rule every view of two runs asks (compare, the report, stage 05,
the MLflow mirror).

A run that `budget.max_minutes` stopped before its planned steps (training/outcome.json: `budget_exhausted`, `steps`,
`planned_steps`) trained less than its card says. Two runs whose completed steps differ, one of them budget-stopped,
are not comparable — "8/24 steps vs 24/24" — unless both cards say the budget is the protocol
(`budget.is_protocol: true`: every variant gets the same minutes, and the steps they reach are part of the result).
Runs that differ in planned steps by design (a variant with more epochs), each trained to its end, stay comparable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import yaml

from labkit.core import io

OUTCOME_PATH = ("training", "outcome.json")  # written by stage 04 (labkit.stages.training)
FIT_PATH = ("parameter_check", "fit.json")  # stage 03's time plan: the planned steps of runs before planned_steps


class TrainingSteps(TypedDict):
    """What a run's training reached: `steps` of `planned`, whether the budget stopped it, whether its card says the
    budget is the protocol."""

    steps: int | None  # None: not trained (no outcome.json)
    planned: int | None  # None: unknown
    budget_stopped: bool
    budget_is_protocol: bool


class Comparability(TypedDict):
    """`comparable`'s answer."""

    comparable: bool
    why: str  # "" when comparable; else e.g. "8/24 steps vs 24/24 (budget-stopped)"
    a: str  # the steps as "8/24"
    b: str


def training_steps(run_dir: Path) -> TrainingSteps:
    """The steps a run's training completed and planned, from training/outcome.json (and stage 03's plan).

    Args:
        run_dir: the run folder.
    Returns:
        the run's `TrainingSteps`.
    """
    run_dir = Path(run_dir)
    outcome_path, fit_path, card_path = run_dir.joinpath(*OUTCOME_PATH), run_dir.joinpath(*FIT_PATH), run_dir / "card.yaml"
    outcome = io.read_json(outcome_path) if outcome_path.exists() else {}
    planned = outcome.get("planned_steps")
    if planned is None and fit_path.exists():
        planned = (io.read_json(fit_path).get("plan") or {}).get("steps")
    card = yaml.safe_load(card_path.read_text(encoding="utf-8")) if card_path.exists() else {}
    return {"steps": outcome.get("steps"), "planned": planned, "budget_stopped": bool(outcome.get("budget_exhausted")),
            "budget_is_protocol": bool(((card or {}).get("budget") or {}).get("is_protocol"))}


def steps_text(steps: TrainingSteps) -> str:
    """"8/24" (completed / planned steps), "8" when the plan is unknown, "—" when not trained."""
    if steps["steps"] is None:
        return "—"
    return f"{steps['steps']}/{steps['planned']}" if steps["planned"] else str(steps["steps"])


def budget_note(steps: TrainingSteps) -> str:
    """"budget-stopped at 8/24 steps" for a run budget.max_minutes stopped, else ""."""
    return f"budget-stopped at {steps_text(steps)} steps" if steps["budget_stopped"] else ""


def comparable(a: Path | TrainingSteps, b: Path | TrainingSteps) -> Comparability:
    """Whether two runs trained comparably, and why not: different completed steps where one of them was stopped by
    its budget are not comparable, unless both cards say `budget.is_protocol: true`.

    Args:
        a: a run folder, or its `training_steps`.
        b: the other.
    Returns:
        {"comparable", "why" (e.g. "8/24 steps vs 24/24 (budget-stopped)"), "a", "b" (each "done/planned")}.
    """
    sa, sb = (x if isinstance(x, dict) else training_steps(x) for x in (a, b))
    out: dict[str, Any] = {"comparable": True, "why": "", "a": steps_text(sa), "b": steps_text(sb)}
    stopped = sa["budget_stopped"] or sb["budget_stopped"]
    if stopped and sa["steps"] != sb["steps"] and not (sa["budget_is_protocol"] and sb["budget_is_protocol"]):
        out.update(comparable=False, why=f"{out['a']} steps vs {out['b']} (budget-stopped; set budget.is_protocol: "
                                         "true if the budget is the protocol)")
    return out  # type: ignore[return-value]


def marked(decision: dict[str, Any], run_dir: Path, reference_dir: Path | None = None) -> dict[str, Any]:
    """A verdict with its budget stop said in its sentence, and "not comparable" when its reference run (a sibling
    variant) trained a different number of steps (`comparable`); the decision itself is unchanged.

    Args:
        decision: a `labkit.evaluate.verdict.Verdict` (a dict).
        run_dir: the judged run's folder.
        reference_dir: the reference variant's run folder (None: the reference is the baseline).
    Returns:
        a copy with "verdict" extended when either applies (the same keys: verdict.json stays a `Verdict`).
    """
    steps = training_steps(run_dir)
    note = budget_note(steps)
    against = comparable(steps, reference_dir) if reference_dir is not None else None
    if not note and (against is None or against["comparable"]):
        return decision
    text = decision["verdict"] + (f" {note[0].upper()}{note[1:]} (budget.max_minutes): it trained fewer steps than "
                                  "its card planned." if note else "")
    if against is not None and not against["comparable"]:
        text += f" Not comparable with its reference run: {against['why']}."
    return {**decision, "verdict": text}
