"""Stage 05 (notebooks/05_comparison.ipynb): the tuned model under the baseline's evaluation, side by side.

The verdict on the hypothesis is `labkit.evaluate.verdict`; the comparison with the experiment's other
variants is `labkit.experiment.compare`.
"""

from __future__ import annotations

from typing import Any

from labkit.errors import MissingInput
from labkit.evaluate.run_metrics import reference_metrics, reference_run, run_metrics
from labkit.evaluate.verdict import verdict
from labkit.model.loading import load_model
from labkit.model.sources import ResolvedModel
from labkit.stages.baseline import evaluate

# peft takes seconds to import: imported inside the functions that use them, so `labkit` commands and card checks start
# fast


def evaluate_tuned(stage: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The tuned model under the baseline's procedure: the card's evaluation split, prompts, decoding and metrics.

    Args:
        stage: the open comparison Stage.
    Returns:
        (per-example rows with scores, aggregated metrics), also saved as tuned_predictions.jsonl and
        tuned_metrics.json.
    """
    return evaluate(stage, load_tuned(stage), "tuned")


def load_tuned(stage: Any) -> Any:
    """The base model with this run's trained adapter (or the fully trained model for method full)."""
    from peft import PeftModel

    adapter = stage.run.dir / "training" / "adapter"
    if not adapter.exists():
        raise MissingInput(f"{adapter} is missing: run the training stage of this run first")
    if stage.card.method.kind == "full":
        return load_model(ResolvedModel(stage.model_source.source, "local", str(adapter), stage.model_source.revision),
                          stage.card, stage.device)
    base = stage.load_model()
    model = PeftModel.from_pretrained(base, str(adapter))
    model.eval()
    return model


def judge(stage: Any, baseline_metrics: dict[str, Any], tuned_metrics: dict[str, Any]) -> dict[str, Any]:
    """The verdict against the card's reference (the baseline, or a sibling variant's latest completed run).

    The run metrics of this run (time, throughput, memory, cost) are added to tuned_metrics.json under "run".

    Args:
        stage: the open comparison Stage.
        baseline_metrics: the base model's metrics.
        tuned_metrics: this run's.
    Returns:
        `labkit.evaluate.verdict.verdict`'s decision, also saved as verdict.json.
    """
    price = stage.card.budget.price_per_gpu_hour
    tuned_metrics["run"] = run_metrics(stage.run.dir, price)
    stage.save_json("tuned_metrics.json", tuned_metrics)
    against = stage.card.experiment.target.against
    reference, ref_id = None, None
    if against != "baseline":
        row = reference_run(stage.run.root, stage.run.experiment, against)
        if row is not None:
            reference, ref_id = reference_metrics(row["dir"], price), row["run_id"]
    decision = verdict(stage.card, baseline_metrics, tuned_metrics, reference, ref_id)
    stage.save_json("verdict.json", decision)
    return decision


def score_key(rows: list[dict[str, Any]]) -> str:
    """The per-example score shown in the example tables: right or not (labels), field accuracy (JSON), else ROUGE-L."""
    return next(k for k in ("correct", "field_accuracy", "rougeL") if k in rows[0])


def _side_by_side(row: dict[str, Any], base: dict[str, Any], key: str) -> dict[str, Any]:
    # targets and answers whole: a cut JSON answer hides the field that was wrong
    return {"id": row["id"], "category": row.get("category"), "target": row["target"], "baseline": base["prediction"],
            "tuned": row["prediction"], f"{key} (base→tuned)": f"{base[key]:.2f}→{row[key]:.2f}"}


def examples_table(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], n: int = 6) -> list[dict[str, Any]]:
    """A few examples side by side, where the tuned model changed the score most (targets and answers whole)."""
    base = {r["id"]: r for r in base_rows}
    key = score_key(tuned_rows)
    ordered = sorted(tuned_rows, key=lambda r: -abs(r[key] - base[r["id"]][key]))
    return [_side_by_side(row, base[row["id"]], key) for row in ordered[:n]]


def failing_table(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], n: int = 10) -> list[dict[str, Any]]:
    """The tuned model's failing rows (score below 1), worst first, regressions before the rest, whole."""
    base = {r["id"]: r for r in base_rows}
    key = score_key(tuned_rows)
    failing = [r for r in tuned_rows if r[key] < 1.0]
    failing.sort(key=lambda r: (r[key] - base[r["id"]][key] >= 0, r[key], r["id"]))
    return [_side_by_side(row, base[row["id"]], key) for row in failing[:n]]


def concentration_text(found: dict[str, Any] | None, metric: str) -> str:
    """One line on where the gain comes from: the numbers when computed, or why it was not."""
    if found is None:
        return f"No per-example view: {metric} is a run metric (one number per run), so the gain cannot be located."
    flags = found["flags"]
    return ("**Concentrated:** " + "; ".join(flags) + "." if flags else "Not concentrated: " + found["statement"] + ".")


def paired_view(stage: Any, base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]]) -> str:
    """Wins / losses / ties against the baseline on the primary metric's per-example value and where the gain comes
    from; saved as paired.json and concentration.json.

    Returns:
        the statement, with its numbers (markdown).
    """
    from labkit.evaluate.verdict import paired
    from labkit.scoring.bootstrap import concentration_for

    primary = stage.card.experiment.target.primary_metric
    pairs = paired(base_rows, tuned_rows, primary)
    stage.save_json("paired.json", pairs)
    found = concentration_for(base_rows, tuned_rows, primary)
    stage.save_json("concentration.json", found)
    where = concentration_text(found, primary)
    if not pairs["key"]:
        return where
    return (f"Against the baseline on `{pairs['key']}`: **{pairs['wins']} wins, {pairs['losses']} losses, "
            f"{pairs['ties']} ties**. {where}")
