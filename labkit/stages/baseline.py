"""Stage 01 (notebooks/01_baseline.ipynb): measure the base model on the held-out split before any training.

The baseline of an experiment is cached by the hash of (model revision, evaluation data, evaluation
procedure) and shared by its variants. The base model is measured under every prompt of `eval.baseline_prompts`
(`labkit.evaluate.baseline_prompts`): `run_baseline` writes each one's prompts/<name>_predictions.jsonl and
prompts/<name>_metrics.json, baseline_prompts.json (all of them, the strongest named), baseline_predictions.jsonl and
baseline_metrics.json (the strongest prompt's: the reference) and baseline_key.json; `decide` records the stage done
with the number the tuned model has to beat.
"""

from __future__ import annotations

import json
import shutil
from typing import Any, TypedDict, cast

from labkit.card.baseline_prompts import DEFAULT, FewShotPrompt, spec
from labkit.card.experiment_and_data import Prompt
from labkit.card.schema import Card
from labkit.core import io
from labkit.data.sources import sha256_text
from labkit.evaluate.baseline_prompts import PromptResult, measure_all, strongest
from labkit.evaluate.procedure import evaluate_rows
from labkit.evaluate.verdict import higher_is_better
from labkit.model.loading import baseline_numerics, baseline_quantize
from labkit.scoring.metrics import RUN_METRICS
from labkit.show.escape import md_code, md_text
from labkit.stages.context import Stage
from labkit.stages.records import (
    BASELINE_KEY,
    BASELINE_METRICS,
    BASELINE_PREDICTIONS,
    BASELINE_PROMPT_FILES,
    BASELINE_PROMPTS,
    BaselineSummary,
    strongest_baseline,
)


class Baseline(TypedDict):
    """The base model's measurement (`run_baseline`)."""

    metrics: dict[str, Any]  # aggregated (baseline_metrics.json)
    rows: list[dict[str, Any]]  # per example, with scores (baseline_predictions.jsonl)
    cached: bool  # the experiment's cached measurement of the same thing was reused
    key: str  # the cache key (`baseline_key`)
    prompts: dict[str, Any]  # baseline_prompts.json: {"primary_metric", "higher_is_better", "strongest", "prompts"}


class Target(TypedDict):
    """What the tuned model must reach (`target_statement`)."""

    baseline: float | None  # None for a run metric
    needed: float | None  # None unless min_improvement against the baseline
    text: str  # markdown


def evaluate(stage: Stage, model: Any, label: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
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


def baseline_key(stage: Stage) -> str:
    """Hash of what makes two baselines the same measurement."""
    manifest = stage.prepare_data()
    card = stage.card  # after preparation: eval.max_new_tokens sized from the data when the card leaves it out
    what = {
        "model_revision": stage.model_source.revision,
        "model_dtype": card.model.dtype,
        # a CPU float32 baseline is not a GPU 4-bit one; Phi in float16 computes its scores in float32
        "numerics": baseline_numerics(card, stage.device, stage.model_config.model_type),
        "eval_split_sha256": manifest["split"]["sha256"][card.eval.split],
        "chat_template_sha256": manifest["tokenizer"]["chat_template_sha256"],
        "eval": card.eval.model_dump(exclude={"baseline_prompts"}),
        "prompt": card.data.prompt.model_dump(exclude=Prompt.TRAINING_ONLY),
        "target_format": card.data.target_format.model_dump(),
        "max_length": card.data.max_length,
    }
    if card.eval.baseline_prompts != DEFAULT:  # the default keeps the key of the runs before baseline prompts
        what["baseline_prompts"] = [spec(p) for p in card.eval.baseline_prompts]
        if any(isinstance(p, FewShotPrompt) for p in card.eval.baseline_prompts):
            what["train_split_sha256"] = manifest["split"]["sha256"]["train"]
    return sha256_text(json.dumps(what, sort_keys=True))[:16]


def record_prompts(stage: Stage, measured: list[tuple[PromptResult, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Write every measured prompt's predictions and metrics, baseline_prompts.json, and the strongest prompt's as
    baseline_predictions.jsonl and baseline_metrics.json (the reference every later stage reads).

    Args:
        stage: the open baseline Stage.
        measured: `labkit.evaluate.baseline_prompts.measure_all`'s answer.
    Returns:
        the content of baseline_prompts.json.
    """
    metric = stage.card.experiment.target.primary_metric
    results = [result for result, _ in measured]
    best = strongest(results, metric)
    entries = []
    for result, scored in measured:
        files = {}
        if result["skipped"] is None:
            files = {"predictions": f"{BASELINE_PROMPT_FILES}/{result['name']}_predictions.jsonl",
                     "metrics": f"{BASELINE_PROMPT_FILES}/{result['name']}_metrics.json"}
            stage.save_jsonl(files["predictions"], scored)
            stage.save_json(files["metrics"], result["metrics"])
        if result["name"] == best:
            stage.save_jsonl(BASELINE_PREDICTIONS, scored)
            stage.save_json(BASELINE_METRICS, result["metrics"])
        entries.append({**result, **files})
    record = {"primary_metric": metric, "higher_is_better": higher_is_better(metric), "strongest": best,
              "prompts": entries}
    stage.save_json(BASELINE_PROMPTS, record)
    return record


def run_baseline(stage: Stage) -> Baseline:
    """Measure the base model under every prompt of `eval.baseline_prompts` (or reuse this experiment's cached
    measurement of the same thing); the strongest on the primary metric is the reference.

    Args:
        stage: the open baseline Stage.
    Returns:
        the Baseline (the reference's metrics and rows); baseline_predictions.jsonl and baseline_metrics.json (the
        strongest prompt's), baseline_prompts.json, prompts/<name>_predictions.jsonl and prompts/<name>_metrics.json
        (every measured prompt's) and baseline_key.json are written.
    """
    key = baseline_key(stage)
    cache = stage.run.root / stage.run.experiment / "_baseline" / key
    files = (BASELINE_PREDICTIONS, BASELINE_METRICS, BASELINE_PROMPTS)
    if all((cache / f).exists() for f in files):
        for name in files:
            shutil.copyfile(cache / name, stage.path(name))
        if (cache / BASELINE_PROMPT_FILES).is_dir():
            shutil.copytree(cache / BASELINE_PROMPT_FILES, stage.path(BASELINE_PROMPT_FILES), dirs_exist_ok=True)
        cached = True
    else:
        card = stage.card
        few_shot = any(isinstance(p, FewShotPrompt) for p in card.eval.baseline_prompts)
        rows, train = stage.split(card.eval.split), stage.split("train") if few_shot else []
        model = stage.load_model(quantize=baseline_quantize(card))  # as training loads it, unless the card says
        measured = measure_all(model, stage.tokenizer, stage.card, rows, train)
        del model
        record_prompts(stage, measured)
        cache.mkdir(parents=True, exist_ok=True)
        for name in files:
            shutil.copyfile(stage.path(name), cache / name)
        shutil.copytree(stage.path(BASELINE_PROMPT_FILES), cache / BASELINE_PROMPT_FILES, dirs_exist_ok=True)
        io.write_json(cache / "measured_by.json", {"run_id": stage.run.run_id, "time": io.utc_now()})
        cached = False
    rows = io.read_jsonl(stage.path(files[0]))
    metrics = io.read_json(stage.path(files[1]))
    stage.save_json(BASELINE_KEY, {"key": key, "cached": cached, "cache": str(cache),
                                   "numerics": baseline_numerics(stage.card, stage.device,
                                                                 stage.model_config.model_type)})
    return {"metrics": metrics, "rows": rows, "cached": cached, "key": key,
            "prompts": io.read_json(stage.path(BASELINE_PROMPTS))}


def prompts_table(prompts: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per baseline prompt: its name, what it is, the primary metric, the strongest, why it was skipped.

    Args:
        prompts: baseline_prompts.json (`Baseline["prompts"]`).
    Returns:
        rows for `labkit.show.tables.table`.
    """
    metric = prompts["primary_metric"]
    return [{"prompt": p["name"], "what": p["description"], metric: p["primary"],
             "reference": "strongest" if p["name"] == prompts["strongest"] else "",
             "skipped": p["skipped"] or ""} for p in prompts["prompts"]]


def strongest_words(prompts: dict[str, Any]) -> str:
    """The reference named (markdown, the card's text escaped): which prompt, of how many measured, on which metric.

    Args:
        prompts: baseline_prompts.json (`Baseline["prompts"]`).
    Returns:
        one sentence.
    """
    best = next(p for p in prompts["prompts"] if p["name"] == prompts["strongest"])
    measured = [p for p in prompts["prompts"] if p["skipped"] is None]
    direction = "higher" if prompts["higher_is_better"] else "lower"
    return (f"**Reference: {md_code(best['name'])}** ({md_text(best['description'])}), the strongest of "
            f"{len(measured)} measured prompt{'s' if len(measured) > 1 else ''} on "
            f"{md_code(prompts['primary_metric'])} "
            f"({direction} is better). The tuned model is evaluated with the training prompt.")


def target_statement(card: Card, metrics: dict[str, Any], prompt: str | None = None) -> Target:
    """What the tuned model must reach, said from the baseline (run metrics and a variant reference: said later).

    Args:
        card: the card (experiment.target).
        metrics: the baseline's metrics.
        prompt: the strongest baseline prompt's name, named in the text (None: not named).
    Returns:
        the Target.
    """
    target = card.experiment.target
    base = None if target.primary_metric in RUN_METRICS else metrics["overall"][target.primary_metric]
    which = f" under the {md_code(prompt)} prompt" if prompt else ""
    needed = base + target.min_improvement if base is not None and target.min_improvement is not None else None
    if base is None:
        text = f"`{target.primary_metric}` is a run metric: it is judged in stage 05 against variant {target.against}."
    else:
        text = f"The base model scores **{base:.3f}** on `{target.primary_metric}`{which}. "
        text += (f"The hypothesis holds only if the tuned model reaches **{needed:.3f}** on the same split and "
                 "procedure, with every guardrail passing." if needed is not None and target.against == "baseline"
                 else f"The hypothesis is judged in stage 05 against {target.against}.")
    return {"baseline": base, "needed": needed, "text": text}


def decide(stage: Stage) -> BaselineSummary:
    """Stage 01's decision, from the files `run_baseline` wrote: the number to beat, recorded with the stage.

    Args:
        stage: the open baseline Stage.
    Returns:
        the summary written to baseline/summary.json.
    """
    target = stage.card.experiment.target
    goal = target_statement(stage.card, stage.read(stage.name, BASELINE_METRICS))
    return cast(BaselineSummary, stage.done(baseline_prompt=strongest_baseline(stage.run.dir)["name"],
        primary_metric=target.primary_metric, baseline=goal["baseline"], needed=goal["needed"], against=target.against,
        cached=stage.read(stage.name, BASELINE_KEY)["cached"], data_version=stage.prepare_data()["data_version"]))
