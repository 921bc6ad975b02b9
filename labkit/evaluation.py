"""The evaluation procedure shared by the baseline (stage 01), the comparison (stage 05) and `labkit final`.

Same split, same prompts, same decoding, same metrics. The baseline of an experiment is cached by
the hash of (model revision, evaluation data, evaluation procedure) and shared by its variants.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from labkit import runs as R
from labkit.data import sha256_text
from labkit.generation import generate_answers
from labkit.metrics import score_predictions


def evaluate_rows(model: Any, tokenizer: Any, card: Any, rows: list[dict[str, Any]],
                  label: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The evaluation procedure on given rows: the card's prompts and decoding, then its metrics.

    Used by `evaluate` (validation split) and by `labkit final` (test split), so both measure the same way.

    Args:
        model: the model to evaluate.
        tokenizer: its tokenizer.
        card: the card (prompt, eval settings, target format).
        rows: prepared rows ({"id", "input", "target", "category"}).
        label: progress label ("baseline", "tuned").
    Returns:
        (per-example rows with scores, aggregated metrics).
    """
    return score_answers(card, rows, generate_answers(model, tokenizer, card, rows, desc=f"{label}: generating"))


def score_answers(card: Any, rows: list[dict[str, Any]], answers: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Score answers given to `rows` (in their order) with the card's metrics.

    Args:
        card: the card (target format).
        rows: prepared rows ({"id", "input", "target", "category"}).
        answers: one answer per row.
    Returns:
        (per-example rows with scores, aggregated metrics).
    """
    records = [{"id": r.get("id"), "category": r.get("category"), "input": r["input"], "target": r["target"],
                "prediction": a} for r, a in zip(rows, answers)]
    return score_predictions(records, card.data.target_format.model_dump())


def evaluate(stage: Any, model: Any, label: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Generate on the card's evaluation split and score; save `<label>_predictions.jsonl` and `<label>_metrics.json`.

    Args:
        stage: the open Stage.
        model: the model to evaluate.
        label: file prefix and progress label ("baseline", "tuned").
    Returns:
        (per-example rows with scores, aggregated metrics).
    """
    rows = stage.split(stage.card.eval.split)
    scored, metrics = evaluate_rows(model, stage.tokenizer, stage.card, rows, label)
    stage.save_jsonl(f"{label}_predictions.jsonl", scored)
    stage.save_json(f"{label}_metrics.json", metrics)
    return scored, metrics


def baseline_key(stage: Any) -> str:
    """Hash of what makes two baselines the same measurement."""
    card = stage.card
    manifest = stage.prepare_data()
    what = {
        "model_revision": stage.model_source.revision,
        "model_dtype": card.model.dtype,
        "eval_split_sha256": manifest["split"]["sha256"][card.eval.split],
        "chat_template_sha256": manifest["tokenizer"]["chat_template_sha256"],
        "eval": card.eval.model_dump(),
        "prompt": card.data.prompt.model_dump(),
        "target_format": card.data.target_format.model_dump(),
        "max_length": card.data.max_length,
    }
    return sha256_text(json.dumps(what, sort_keys=True))[:16]


def run_baseline(stage: Any) -> dict[str, Any]:
    """Measure the base model (or reuse this experiment's cached measurement of the same thing).

    Args:
        stage: the open baseline Stage.
    Returns:
        {"metrics", "rows", "cached": bool, "key"}.
    """
    key = baseline_key(stage)
    cache = stage.run.root / stage.run.experiment / "_baseline" / key
    files = ("baseline_predictions.jsonl", "baseline_metrics.json")
    if all((cache / f).exists() for f in files):
        for name in files:
            shutil.copyfile(cache / name, stage.path(name))
        cached = True
    else:
        model = stage.load_model(quantize=False)
        evaluate(stage, model, "baseline")
        del model
        cache.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(stage.path(name), cache / name)
        R.write_json(cache / "measured_by.json", {"run_id": stage.run.run_id, "time": R.utc_now()})
        cached = False
    rows = [json.loads(line) for line in stage.path(files[0]).read_text(encoding="utf-8").splitlines() if line]
    metrics = R.read_json(stage.path(files[1]))
    stage.save_json("baseline_key.json", {"key": key, "cached": cached, "cache": str(cache)})
    return {"metrics": metrics, "rows": rows, "cached": cached, "key": key}


def load_tuned(stage: Any) -> Any:
    """The base model with this run's trained adapter (or the fully trained model for method full)."""
    from peft import PeftModel

    adapter = stage.run.dir / "training" / "adapter"
    if not adapter.exists():
        raise FileNotFoundError(f"{adapter} is missing: run the training stage of this run first")
    if stage.card.method.kind == "full":
        from labkit.loading import load_model
        from labkit.models import ResolvedModel

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


def save_adapter_info(path: Path, stage: Any) -> None:
    """Tie a saved adapter to the exact base model revision (written next to adapter_config.json)."""
    R.write_json(path / "labkit_base_model.json", {"source": stage.model_source.source,
                                                   "revision": stage.model_source.revision,
                                                   "card_hash": stage.loaded.hash, "run_id": stage.run.run_id})
