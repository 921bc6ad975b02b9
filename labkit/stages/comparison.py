"""Stage 05 (notebooks/05_comparison.ipynb): the tuned model under the baseline's evaluation, side by side.

The stage writes tuned_predictions.jsonl and tuned_metrics.json (`evaluate_tuned`), paired.json and
concentration.json (`paired_view`), verdict.json and the run metrics (`judge_run`), experiment.json
(`record_experiment`) and its summary (`decide`, from verdict.json). The verdict on the hypothesis is
`labkit.evaluate.verdict`; the comparison with the experiment's other variants is `labkit.experiment.compare`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from labkit.core.comparability import marked
from labkit.core.io import read_jsonl

from labkit.evaluate.verdict import Verdict, paired, verdict
from labkit.model.tuned import load_tuned
from labkit.scoring.bootstrap import concentration_for
from labkit.scoring.metrics import score_key
from labkit.scoring.stopping import stopping_line, stopping_rows
from labkit.stages.baseline import evaluate
from labkit.stages.context import Stage
from labkit.stages.records import (
    ADAPTER,
    BASELINE_PREDICTIONS,
    CONCENTRATION,
    EXPERIMENT,
    PAIRED,
    TUNED_METRICS,
    TUNED_PREDICTIONS,
    VERDICT,
    ComparisonSummary,
    baseline_named,
    strongest_baseline,
)
from labkit.stages.run_metrics import reference_metrics, reference_run, run_metrics

__all__ = ["concentration_text", "decide", "evaluate_tuned", "examples_table", "failing_table", "judge_run",
           "paired_view", "record_experiment", "score_key", "stopping_view"]


def evaluate_tuned(stage: Stage) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The tuned model under the baseline's procedure: the card's evaluation split, prompts, decoding and metrics.

    Args:
        stage: the open comparison Stage.
    Returns:
        (per-example rows with scores, aggregated metrics), also saved as tuned_predictions.jsonl and
        tuned_metrics.json.
    """
    model = load_tuned(stage.model_source, stage.card, stage.run.dir / "training" / ADAPTER, stage.device)
    return evaluate(stage, model, "tuned")


def judge_run(stage: Stage, baseline_metrics: dict[str, Any], tuned_metrics: dict[str, Any]) -> Verdict:
    """This run's verdict against the card's reference (the baseline, or a sibling variant's latest completed run).

    The run metrics of this run (time, throughput, memory, cost) are added to tuned_metrics.json under "run". A
    per-example primary metric is decided on the paired bootstrap interval of its gain, from the per-example
    predictions: the baseline's (baseline_predictions.jsonl) or the reference run's, and this run's
    (tuned_predictions.jsonl, which `evaluate_tuned` wrote).

    Args:
        stage: the open comparison Stage.
        baseline_metrics: the base model's metrics.
        tuned_metrics: this run's.
    Returns:
        `labkit.evaluate.verdict.verdict`'s decision, also saved as verdict.json; a budget-stopped run says so in its
        sentence, and "not comparable" against a reference run of other steps (`labkit.core.comparability.marked`).
    """
    price = stage.card.budget.price_per_gpu_hour
    tuned_metrics["run"] = run_metrics(stage.run.dir, price)
    stage.save_json(TUNED_METRICS, tuned_metrics)
    against = stage.card.experiment.target.against
    reference, ref_id, ref_rows, ref_dir = None, None, None, None
    if against != "baseline":
        row = reference_run(stage.run.root, stage.run.experiment, against)
        if row is not None:
            reference, ref_id, ref_dir = reference_metrics(row["dir"], price), row["run_id"], Path(row["dir"])
            path = Path(row["dir"]) / "comparison" / TUNED_PREDICTIONS
            ref_rows = read_jsonl(path) if path.exists() else None
    else:
        ref_rows = stage.read("baseline", BASELINE_PREDICTIONS)
    tuned_rows = stage.read(stage.name, TUNED_PREDICTIONS)
    decision = verdict(stage.card, baseline_metrics, tuned_metrics, reference, ref_id, reference_rows=ref_rows,
                       tuned_rows=tuned_rows)
    decision = baseline_named(decision, strongest_baseline(stage.run.dir))  # which baseline prompt is the reference
    decision = cast(Verdict, marked(cast(dict, decision), stage.run.dir, ref_dir))  # a budget stop said, and steps
    stage.save_json(VERDICT, decision)
    return decision


def record_experiment(stage: Stage, experiment: dict[str, Any]) -> None:
    """Keep the comparison of the experiment's variants as this stage saw it (experiment.json).

    Args:
        stage: the open comparison Stage.
        experiment: `labkit.experiment.compare.compare_experiment`'s result (the layer above the stages).
    """
    stage.save_json(EXPERIMENT, experiment)


def decide(stage: Stage) -> ComparisonSummary:
    """Stage 05's record, from verdict.json (`judge_run` wrote it): confirmed or not, the primary metric, the sentence.

    Args:
        stage: the open comparison Stage.
    Returns:
        the summary written to comparison/summary.json.
    Raises:
        MissingInput: the verdict has not been written.
    """
    decision: Verdict = stage.read(stage.name, VERDICT)
    return cast(ComparisonSummary, stage.done(confirmed=decision["confirmed"], primary=decision["primary"],
                                              verdict=decision["verdict"]))


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


def paired_view(stage: Stage, base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]]) -> str:
    """Wins / losses / ties against the baseline on the primary metric's per-example value and where the gain comes
    from; saved as paired.json and concentration.json.

    Returns:
        the statement, with its numbers (markdown).
    """
    primary = stage.card.experiment.target.primary_metric
    pairs = paired(base_rows, tuned_rows, primary)
    stage.save_json(PAIRED, pairs)
    found = concentration_for(base_rows, tuned_rows, primary)
    stage.save_json(CONCENTRATION, found)
    where = concentration_text(found, primary)
    if not pairs["key"]:
        return where
    which = strongest_baseline(stage.run.dir)["name"]
    return (f"Against the baseline (`{which}` prompt) on `{pairs['key']}`: **{pairs['wins']} wins, {pairs['losses']} "
            f"losses, {pairs['ties']} ties**. {where}")


def stopping_view(stage: Stage, baseline_metrics: dict[str, Any],
                  tuned_metrics: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """How often the baseline's and the tuned model's answers stopped before eval.max_new_tokens, and their length.

    Args:
        stage: the open comparison Stage (its card's eval.max_new_tokens).
        baseline_metrics: the base model's metrics.
        tuned_metrics: this run's.
    Returns:
        (one sentence with the numbers (markdown), `labkit.scoring.stopping.stopping_rows`' table).
    """
    named = {"baseline": baseline_metrics, "tuned": tuned_metrics}
    limit = stage.card.eval.max_new_tokens
    return stopping_line(named, limit), stopping_rows(named, limit)
