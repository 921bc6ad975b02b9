"""What stages 01, 02, 04 and 05 write: the file names of their folders and the typed records that other modules read.

The stage's module in `labkit.stages` writes every file of its folder and its summary (`Stage.done`); notebook cells
call, show and explain. This module only names those files and types their content, with identifier keys, and
imports nothing beyond the standard library (and types), so the command line's budget status, the planner and the
run metrics read a run folder without loading a model library. The JSON on disk is what these types describe.
Stage 03's files are named in `labkit.stages.parameter_check`; the data manifest is `labkit.data.prepare`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from labkit.core import io

if TYPE_CHECKING:
    from labkit.evaluate.verdict import PrimaryCheck

SUMMARY = "summary.json"  # every stage: written by Stage.done

# stage 01 · baseline/
BASELINE_PREDICTIONS = "baseline_predictions.jsonl"
BASELINE_METRICS = "baseline_metrics.json"
BASELINE_KEY = "baseline_key.json"
BASELINE_PROMPTS = "baseline_prompts.json"  # every prompt measured: {"strongest", "prompts": [PromptResult…]}
BASELINE_PROMPT_FILES = "prompts"  # a folder: <name>_predictions.jsonl and <name>_metrics.json per measured prompt
# baseline_predictions.jsonl and baseline_metrics.json are the strongest prompt's: the reference of the hypothesis

# stage 02 · preprocessing/ (leakage.json, cleaning.json and planted.json are written by labkit.data.prepare)
CATEGORY_COUNTS = "category_counts.json"
PLANTED_CHECK = "planted_check.json"
CHECKS = "checks.json"
LENGTHS = "lengths.json"
SAMPLES = "samples.html"
LEAKAGE = "leakage.json"
CLEANING = "cleaning.json"
PLANTED = "planted.json"

# stage 03 · parameter_check/: written by labkit.stages.parameter_check
MATCHED_MODULES = "matched_modules.json"
PARAMETERS = "parameters.json"
UPDATE_CHECK = "update_check.json"
MEMORY = "memory.json"  # MemoryReport: lengths, estimates, measured, comparison, generation
MEMORY_PLOT = "memory.png"
FIT = "fit.json"  # {"verdict": FitVerdict, "plan": TimePlan}
ACCUMULATION_CHECK = "accumulation_check.json"
CHECKPOINTING_CHECK = "checkpointing_check.json"

# stage 04 · training/
OUTCOME = "outcome.json"
LOG_HISTORY = "log_history.jsonl"
ADAPTER = "adapter"  # a folder: the adapter (or model), its tokenizer and labkit_base_model.json
CHECKPOINTS = "trainer"  # a folder: the trainer's checkpoints
PACKING_CHECK = "packing_check.json"
ACCELERATE_CONFIG = "accelerate_config.yaml"
RENDEZVOUS = "rendezvous.json"  # on several machines: every process met (written by the head's first process)

# stage 05 · comparison/
TUNED_PREDICTIONS = "tuned_predictions.jsonl"
TUNED_METRICS = "tuned_metrics.json"
VERDICT = "verdict.json"
PAIRED = "paired.json"
CONCENTRATION = "concentration.json"
EXPERIMENT = "experiment.json"


class TrainingCost(TypedDict):
    """training/outcome.json → "cost": the tokens training fed the model, counted, and what they cost in FLOPs
    (`labkit.train.token_count.cost_record`; the convention is docs/cost.md's)."""

    tokens: int  # non-padding positions trained on, all processes, the whole run (resumes included)
    loss_tokens: int  # positions whose next-token label is scored
    session_tokens: int  # tokens of this session (since the checkpoint it resumed from)
    step_seconds: float  # this session's wall time in optimiser steps (fetching batches to the update; no evaluation)
    tokens_per_second: float | None  # session_tokens / step_seconds
    parameters: int  # N: weights the forward multiplies by (embedding lookups excluded)
    trainable_parameters: int
    reference_parameters: int  # a reference model's N run forward on the same tokens (DPO), else 0
    flops_per_token: float  # 4N + 2N_trainable (+ 2N_ref): 6N for full training
    convention: str
    precision: str  # "bf16" | "fp16" | "fp32"
    peak_flops: float | None  # FLOP/s of all processes' devices (None: unknown, no MFU)
    peak_source: str  # the spec sheet's device and dtype, or how the CPU's rate was measured
    world_size: int
    mfu: float | None  # flops_per_token × tokens_per_second / peak_flops


class TrainingOutcome(TypedDict):
    """training/outcome.json: what stage 04's training did (rank 0 writes it; the stage reads it back)."""

    steps: int  # optimiser steps reached (the trainer's global step)
    planned_steps: int  # the steps the card asked for (the trainer's max_steps); fewer reached: see budget_exhausted
    metrics: dict[str, float]  # the trainer's own: train_runtime, train_loss, epoch, …
    resumed_from: str | None  # the checkpoint this session continued from
    budget_exhausted: bool  # budget.max_minutes stopped training (a checkpoint was written)
    budget_warning: str | None  # the ETA exceeded the budget left during training (labkit.train.callbacks)
    world_size: int  # processes
    interrupted: str | None  # a signal stopped training: what and how to continue
    best_step: int | None
    best_eval_loss: float | None
    early_stopped: bool
    early_stopping: dict[str, Any] | None  # labkit.train.early_stopping.summary
    cost: TrainingCost | None  # absent in runs trained before labkit counted them


class StageSummary(TypedDict):
    """<stage>/summary.json: the keys `Stage.done` adds to every stage's summary."""

    stage: str
    seconds: float  # the stage's own wall time, from open_stage to done


class BaselineSummary(StageSummary):
    """baseline/summary.json."""

    primary_metric: str
    baseline: float | None  # the base model's primary metric (None for a run metric)
    needed: float | None  # what the tuned model must reach (None unless min_improvement against the baseline)
    against: str
    cached: bool  # the experiment's cached measurement was reused
    data_version: str
    baseline_prompt: str  # the strongest prompt's name (baseline_prompts.json), the reference's


class PreprocessingSummary(StageSummary):
    """preprocessing/summary.json."""

    data_version: str
    sizes: dict[str, int]  # rows per split
    duplicate_pairs: int
    cross_split_pairs: int
    checks_ok: bool


class TrainingSummary(StageSummary):
    """training/summary.json (the numbers come from training/outcome.json and the log history)."""

    steps: int
    trainer: str
    first_loss: float | None
    last_loss: float | None
    train_seconds: float | None
    world_size: int
    resumed_from: str | None
    budget_exhausted: bool


class ComparisonSummary(StageSummary):
    """comparison/summary.json (from comparison/verdict.json)."""

    confirmed: bool
    primary: PrimaryCheck
    verdict: str


def read_outcome(run_dir: Path) -> TrainingOutcome | None:
    """A run's training outcome, or None when stage 04 has not written it.

    Args:
        run_dir: the run folder.
    Returns:
        the content of training/outcome.json.
    """
    path = Path(run_dir) / "training" / OUTCOME
    return io.read_json(path) if path.exists() else None


def strongest_baseline(run_dir: Path) -> dict[str, Any]:
    """Which prompt the run's baseline (baseline_predictions.jsonl, baseline_metrics.json) was measured under.

    Args:
        run_dir: the run folder.
    Returns:
        {"name", "description", "measured"}: the strongest prompt of baseline/baseline_prompts.json and how many
        prompts were measured; a run from before baseline prompts has the training prompt, 1 measured.
    """
    path = Path(run_dir) / "baseline" / BASELINE_PROMPTS
    if not path.exists():
        return {"name": "training", "description": "the training prompt", "measured": 1}
    record = io.read_json(path)
    best = next(p for p in record["prompts"] if p["name"] == record["strongest"])
    measured = sum(p["skipped"] is None for p in record["prompts"])
    return {"name": best["name"], "description": best["description"], "measured": measured}


def baseline_named(decision: Any, which: dict[str, Any]) -> Any:
    """The verdict with the baseline's prompt named in its sentence (when more than one prompt was measured).

    Args:
        decision: a `labkit.evaluate.verdict.Verdict`.
        which: `strongest_baseline`'s answer.
    Returns:
        the same verdict, its `verdict` text naming the prompt ("against the baseline (strongest of 3 prompts: …)").
    """
    if which["measured"] <= 1 and which["name"] == "training":
        return decision
    said = f"the baseline (strongest of {which['measured']} prompts: {which['name']}, {which['description']})"
    text = decision["verdict"]
    if "against the baseline" in text:
        text = text.replace("against the baseline", f"against {said}", 1)
    else:
        text = f"{text} Baseline: {said[len('the baseline '):].strip('()')}."
    return {**decision, "verdict": text}
