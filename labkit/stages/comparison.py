"""Stage 05 (notebooks/05_comparison.ipynb): the tuned model under the baseline's evaluation, side by side.

The verdict on the hypothesis is `labkit.evaluate.verdict`; the comparison with the experiment's other
variants is `labkit.experiment.compare`.
"""

from __future__ import annotations

from typing import Any

from labkit.errors import MissingInput
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


def examples_table(base_rows: list[dict[str, Any]], tuned_rows: list[dict[str, Any]], n: int = 6) -> list[dict[str, Any]]:
    """A few examples side by side, where the tuned model changed the score first."""
    base = {r["id"]: r for r in base_rows}
    key = "field_accuracy" if "field_accuracy" in tuned_rows[0] else "rouge_l"
    out = []
    for row in sorted(tuned_rows, key=lambda r: -abs(r[key] - base[r["id"]][key])):
        out.append({"id": row["id"], "category": row.get("category"), "target": row["target"],
                    "baseline": base[row["id"]]["prediction"][:160], "tuned": row["prediction"][:160],
                    f"{key} (base→tuned)": f"{base[row['id']][key]:.2f}→{row[key]:.2f}"})
        if len(out) >= n:
            break
    return out
