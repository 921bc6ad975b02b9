"""Stage 03, the parameter check: every file it writes, written here; the notebook calls, shows and explains.

One model is loaded (the card's method applied) and shared by the checks (`labkit.preflight.shared.SharedModel`:
each check, and each arm of a check, starts from the same initial weights); the training and validation rows are
tokenised once. Memory is measured first — the step at each length, then the checkpointing arms — with glibc set
for exact figures; then the allocator is set as a training process has it for everything that only checks, times
or compares: the update check, the timed steps and one evaluation batch, the accumulation check
(`labkit.preflight.timing.Phases`, which refuses a measurement after them). On CUDA the measurement slows nothing,
and the measured steps are the timed ones (`labkit.preflight.timing.time_measured`). A QLoRA model's 4-bit weights stay
in the layout training differentiates through, evaluation forwards included (`method.keep_training_layout`). The
arithmetic lives in `labkit.preflight` (estimate, measurement, timing, step checks, time plan).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from labkit.card.schema import Card
from labkit.core.progress import fmt_seconds, timed
from labkit.data.prompting import IGNORE, encode_rows
from labkit.errors import StageFailed
from labkit.model import method
from labkit.preflight import stepchecks
from labkit.preflight.arms import SCALER_SKIPS
from labkit.preflight.measure import free_device_memory
from labkit.preflight.memory import estimate_generation, estimate_step
from labkit.preflight.memory_check import MemoryReport, measure_lengths, report, time_lengths
from labkit.preflight.records import AccumulationCheck, CheckpointingCheck, FitVerdict, MemoryEstimate, TimePlan
from labkit.preflight.records import UpdateCheck
from labkit.preflight.shared import SharedModel
from labkit.preflight.sizing import fit_verdict
from labkit.preflight.timing import Phases
from labkit.preflight.timeplan import packed_lengths, rejected_text, representative_lengths, time_plan
from labkit.show import plots
from labkit.stages import records
from labkit.stages.context import Stage
from labkit.train.trainer import build_trainer

# the file names are stage 03's, kept with the others' in labkit.stages.records so readers need no model library
MATCHED_FILE, PARAMETERS_FILE, UPDATE_FILE = records.MATCHED_MODULES, records.PARAMETERS, records.UPDATE_CHECK
MEMORY_FILE, MEMORY_PLOT, FIT_FILE = records.MEMORY, records.MEMORY_PLOT, records.FIT
ACCUMULATION_FILE, CHECKPOINTING_FILE = records.ACCUMULATION_CHECK, records.CHECKPOINTING_CHECK
SUMMARY_KEYS = ("method", "trainable", "total", "update_ok", "seconds_per_step", "estimate_error", "peak_gib", "fits",
                "check_seconds", "skipped")


class Summary(TypedDict):
    """Stage 03's summary.json (besides "stage" and "seconds", the stage's wall time, which `Stage.done` adds)."""

    method: str
    trainable: int
    total: int
    update_ok: bool
    seconds_per_step: float
    estimate_error: list[float | None]
    peak_gib: list[float]
    fits: str
    check_seconds: dict[str, float]
    skipped: dict[str, str]  # check file stem -> why it was not measured (`skipped_checks`)


class Fit(TypedDict):
    """fit.json: the fit verdict at the longest row and the time plan."""

    verdict: FitVerdict
    plan: TimePlan


@dataclass
class Checks:
    """What stage 03's cells share: the model, the rows tokenised once, the results so far and each check's seconds."""

    model: SharedModel
    train_rows: list[dict[str, Any]]
    encoded: list[Any]  # the training rows encoded once (labkit.data.prompting.encode_rows)
    train_lengths: list[int]
    validation_lengths: list[int]
    lengths: dict[str, int]  # the two lengths a step is measured at: {"p95", "max"}
    loss_fraction: float
    phases: Phases  # memory measured first, then the unmeasured steps (update, timing, accumulation)
    parameters: list[dict[str, Any]] = field(default_factory=list)
    update: UpdateCheck | None = None
    estimates: list[MemoryEstimate] = field(default_factory=list)
    memory: MemoryReport | None = None
    fit: Fit | None = None
    accumulation: AccumulationCheck | None = None
    checkpointing: CheckpointingCheck | None = None
    seconds: dict[str, float] = field(default_factory=dict)


def open_checks(stage: Stage) -> Checks:
    """Load the model once with the card's method applied, and tokenise the training and validation rows once.

    Args:
        stage: stage 03's context.
    Returns:
        the shared state of the stage's checks; the lengths are the p95 and max of the examples (stage 02's
        lengths.json), or of the packed rows for a packed card.
    """
    seconds: dict[str, float] = {}
    with timed(seconds, "load_model", None):  # labkit.model.loading reports the loading
        model = SharedModel(method.apply_method(stage.load_model(), stage.card))
    with timed(seconds, "tokenise", "tokenising the training and validation rows"):
        card, train_rows = stage.card, stage.split("train")
        encoded = encode_rows(stage.tokenizer, card, train_rows)
        train = [min(len(e.input_ids), card.data.max_length) for e in encoded]
        validation = token_lengths(stage.tokenizer, card, stage.split("validation"))
        tokens = sum(len(e.input_ids) for e in encoded)
        fraction = sum(sum(1 for x in e.labels if x != IGNORE) for e in encoded) / tokens if tokens else 1.0
        lengths = packed_lengths(card, train) if card.train.packing else representative_lengths(
            stage.read("preprocessing", "lengths.json"), card.data.max_length)
    return Checks(model=model, train_rows=train_rows, encoded=encoded, train_lengths=train, validation_lengths=validation,
                  lengths=lengths, loss_fraction=fraction, phases=Phases(stage.device), seconds=seconds)


def token_lengths(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> list[int]:
    """Tokens of each prepared row as the trainer sees it (prompt + completion, cut at data.max_length)."""
    return [min(len(e.input_ids), card.data.max_length) for e in encode_rows(tokenizer, card, rows)]


def target_modules(stage: Stage, checks: Checks) -> list[dict[str, Any]]:
    """Which linear module kinds the method adapts, in how many layers (`MATCHED_FILE`)."""
    matched = method.matched_modules(checks.model.model)
    stage.save_json(MATCHED_FILE, matched)
    return matched


def parameters(stage: Stage, checks: Checks) -> list[dict[str, Any]]:
    """Trainable and total parameters by kind, the last row the total (`PARAMETERS_FILE`)."""
    checks.parameters = method.parameter_table(checks.model.model)
    stage.save_json(PARAMETERS_FILE, checks.parameters)
    return checks.parameters


def update(stage: Stage, checks: Checks) -> UpdateCheck:
    """Two optimiser steps of the stage-04 trainer on real training batches: what changed (`UPDATE_FILE`).

    Up to `labkit.preflight.arms.SCALER_SKIPS` more trainer steps leave room for the steps an fp16 loss scaler
    skips (named in the record, not counted).
    """
    card = stage.card
    checks.phases.unmeasured_from_here()
    with timed(checks.seconds, "update_check", "update check: 2 optimiser steps"):
        rows = checks.train_rows[: card.train.micro_batch * card.train.grad_accum * 2]
        trainer = build_trainer(card, checks.model(), stage.tokenizer, rows, Path(tempfile.mkdtemp(prefix="labkit-check-")),
                                device=stage.device, max_steps=2 + SCALER_SKIPS, lr_scheduler_type="constant",
                                warmup_steps=0, logging_steps=1, disable_tqdm=True)  # no bar: it stops after 2 steps taken
        checks.update = stepchecks.update_check(trainer, card, steps=2)
        del trainer
    stage.save_json(UPDATE_FILE, checks.update)
    return checks.update


def estimate(stage: Stage, checks: Checks) -> list[MemoryEstimate]:
    """The memory of a complete step at the two lengths, from the config on the meta device (nothing allocated)."""
    checks.estimates = [estimate_step(stage.model_config, stage.card, n, device=stage.device,
                                      loss_fraction=checks.loss_fraction) for n in checks.lengths.values()]
    return checks.estimates


def generation(stage: Stage, checks: Checks) -> dict[str, Any]:
    """The memory of evaluation-time generation (KV cache, logits) at the longest row (kept in `MEMORY_FILE`)."""
    return estimate_generation(stage.model_config, stage.card, checks.lengths["max"], stage.device,
                               checks.estimates[0]["weights_bytes"])


def measure_memory(stage: Stage, checks: Checks, generated: dict[str, Any]) -> MemoryReport:
    """The same step measured at each length on the shared model, against the estimate (`MEMORY_FILE`; the step
    times are added by `time_steps`).

    Args:
        stage: stage 03's context.
        checks: the shared state (`estimate` ran; no unmeasured step yet).
        generated: `generation`'s estimate, written with the rest.
    Returns:
        {"lengths", "estimates", "measured", "comparison", "generation"}.
    """
    checks.phases.measuring("the memory of a step")
    with timed(checks.seconds, "memory_measurement", None):  # each length reports itself (labkit.preflight.memory_check)
        measured = measure_lengths(stage.card, checks.model, stage.tokenizer, checks.train_rows, checks.encoded,
                                   checks.lengths, stage.device)
    checks.memory = {**report(checks.lengths, checks.estimates, measured), "generation": generated}
    stage.save_json(MEMORY_FILE, checks.memory)
    return checks.memory


def time_steps(stage: Stage, checks: Checks) -> MemoryReport:
    """The measured step timed at each length (on CUDA the measured steps' own times), and one evaluation batch,
    with the allocator training has (`MEMORY_FILE`, its measurements with their times).

    Returns:
        the memory report, each measurement with "step_seconds", "seconds_per_step", "eval_seconds", "eval_tokens"
        and "timed_by" ("timed pass" or "memory pass").
    """
    assert checks.memory is not None, "measure_memory first"
    checks.phases.unmeasured_from_here()
    with timed(checks.seconds, "timing", None):  # each length reports itself
        eval_rows = stage.split("validation")[: stage.card.eval.batch_size]
        measured = time_lengths(stage.card, checks.model, stage.tokenizer, checks.train_rows, checks.encoded,
                                checks.memory["measured"], stage.device, eval_rows)
    checks.memory = {**report(checks.lengths, checks.estimates, measured), "generation": checks.memory["generation"]}
    stage.save_json(MEMORY_FILE, checks.memory)
    return checks.memory


def plot_memory(stage: Stage, checks: Checks) -> Any:
    """The estimate's stacked terms with the measured peaks (`MEMORY_PLOT`)."""
    assert checks.memory is not None, "measure_memory first"
    return plots.memory_breakdown(checks.estimates, [m["peak_bytes"] for m in checks.memory["measured"]],
                                  stage.path(MEMORY_PLOT))


def fit(stage: Stage, checks: Checks) -> Fit:
    """The fit verdict at the longest row against the free memory, and the time plan (`FIT_FILE`)."""
    assert checks.memory is not None and "step_seconds" in checks.memory["measured"][0], "time_steps first"
    verdict = fit_verdict(stage.model_config, stage.card, checks.lengths["max"], free_device_memory(stage.device),
                          stage.device, loss_fraction=checks.loss_fraction)
    plan = time_plan(stage.card, checks.train_lengths, checks.validation_lengths, checks.memory["measured"],
                     rejected=stage.prepare_data().get("preference", {}).get("from_base_model"))
    checks.fit = {"verdict": verdict, "plan": plan}
    stage.save_json(FIT_FILE, checks.fit)
    return checks.fit


def plan_text(card: Card, fitted: Fit) -> str:
    """The fit verdict and the time plan in two lines (times as m:ss)."""
    verdict, plan = fitted["verdict"], fitted["plan"]
    rows = f"{plan['rows_per_epoch']} {'packed ' if plan['packed'] else ''}rows per epoch"
    processes = plan.get("processes", 1)
    on = (f" on {processes} processes (scaling efficiency {plan['scaling_efficiency']:.0%} assumed until a run "
          "measures it)" if processes > 1 else "")
    return (f"**Memory:** {verdict['message']}.  \n**Training:** {plan['steps']} optimiser steps{on} of "
            f"{plan['examples_per_step']:.1f} examples ({rows}) × {fmt_seconds(plan['seconds_per_step'])} + "
            f"{plan['evaluations']} validation passes ≈ **{fmt_seconds(plan['train_seconds'])}** (m:ss), "
            f"{plan['cost']:.2f} at the card's price per GPU hour ({'within' if plan['within_budget'] else 'OVER'} "
            f"the {card.budget.max_minutes:g}-minute budget).{rejected_text(plan)}")


def accumulation(stage: Stage, checks: Checks, free_bytes: float | None = None) -> AccumulationCheck:
    """Micro-batch m × accumulation k against one batch of m·k, both from the same weights (`ACCUMULATION_FILE`).

    Each arm is costed by the estimate against the free memory first; an arm that would not fit or runs out of
    memory, and an ORPO card's check (its result is ignored), is recorded `skipped` with the reason, not run.

    Args:
        stage: stage 03's context.
        checks: the shared state.
        free_bytes: the memory free for the arms (default: `labkit.preflight.measure.free_device_memory`).
    """
    checks.phases.unmeasured_from_here()
    with timed(checks.seconds, "accumulation_check", "accumulation check: 2 arms"):
        free = free_device_memory(stage.device) if free_bytes is None else free_bytes
        checks.accumulation = stepchecks.accumulation_check(
            stage.card, checks.model, stage.tokenizer, checks.train_rows, stage.device, encoded=checks.encoded,
            config=stage.model_config, free_bytes=free, loss_fraction=checks.loss_fraction, skip_ignored=True)
    checks.model.restore()  # the model leaves the checks as it was loaded
    stage.save_json(ACCUMULATION_FILE, checks.accumulation)
    return checks.accumulation


def checkpointing(stage: Stage, checks: Checks, free_bytes: float | None = None) -> CheckpointingCheck:
    """The same batch (p95 length) with and without activation checkpointing (`CHECKPOINTING_FILE`).

    Each arm (the one without checkpointing is larger than training) is costed first, as in `accumulation`; its
    memory is measured, so it runs before any unmeasured step.
    """
    checks.phases.measuring("activation checkpointing's memory")
    with timed(checks.seconds, "checkpointing_check", "checkpointing check: 2 arms"):
        free = free_device_memory(stage.device) if free_bytes is None else free_bytes
        checks.checkpointing = stepchecks.checkpointing_check(
            stage.card, checks.model, stage.tokenizer, checks.train_rows, checks.lengths["p95"], stage.device,
            config=stage.model_config, encoded=checks.encoded, free_bytes=free, loss_fraction=checks.loss_fraction)
    stage.save_json(CHECKPOINTING_FILE, checks.checkpointing)
    return checks.checkpointing


def skipped_checks(checks: Checks) -> dict[str, str]:
    """The comparison checks that were not measured, by file stem, with the reason (they fail nothing)."""
    return {name: rec["skipped"] for name, rec in (("accumulation_check", checks.accumulation),
                                                   ("checkpointing_check", checks.checkpointing))
            if rec is not None and rec.get("skipped")}


def failures(checks: Checks) -> list[str]:
    """What stops the run here: a failed update, accumulation or checkpointing check (a non-finite loss or gradient
    included), or a step that does not fit. A check not measurable on this device (`skipped_checks`) is not one."""
    assert checks.update and checks.accumulation and checks.checkpointing and checks.fit, "run every check first"
    acc, ckpt, verdict = checks.accumulation, checks.checkpointing, checks.fit["verdict"]
    out = [f"update check: {p}" for p in checks.update["problems"]]
    if not acc.get("skipped"):
        out += [f"gradient accumulation: {p}" for p in acc.get("nonfinite", [])]
    if not acc["ok"] and not acc.get("skipped") and not acc.get("nonfinite"):
        fix = ("set train.loss_normalisation: tokens" if acc.get("trainer", "sft") == "sft" else
               f"TRL's {acc['trainer']} loss should not depend on how a batch is split: report it")
        out.append(f"gradient accumulation ({acc['loss_normalisation']} normalisation): gradients differ "
                   f"by {acc['relative_difference']:.2e} from one batch of {acc['micro_batch'] * acc['accum']} "
                   f"(tolerance {acc['tolerance']:.0e}); {fix}")
    if not ckpt.get("skipped"):
        out += [f"activation checkpointing: {p}" for p in ckpt["problems"]]
    if not verdict["fits"]:
        out.append(f"memory: {verdict['message']}")
    return out


def decide(stage: Stage, checks: Checks) -> Summary:
    """The stage's verdict: raises when a check failed, else records the stage done with its summary.

    Returns:
        the summary written to parameter_check/summary.json (the keys `labkit plan`, the run metrics and the MLflow
        mirror read; "skipped": the checks not measurable on this device, with why).
    Raises:
        StageFailed: a check failed (the message lists every failure).
    """
    failed = failures(checks)
    if failed:
        raise StageFailed("parameter check failed:\n- " + "\n- ".join(failed))
    assert checks.memory is not None and checks.fit is not None and checks.update is not None
    total, comparison = checks.parameters[-1], checks.memory["comparison"]
    return stage.done(method=stage.card.method.kind, trainable=total["trainable"], total=total["parameters"],
                      update_ok=checks.update["ok"], seconds_per_step=checks.fit["plan"]["seconds_per_step"],
                      estimate_error=[r["step_error"] for r in comparison],
                      peak_gib=[r["peak_gib_measured"] for r in comparison], fits=checks.fit["verdict"]["message"],
                      check_seconds=dict(checks.seconds), skipped=skipped_checks(checks))


def decision_text(checks: Checks) -> str:
    """The decision in one line (the checks not measured, and the steps an fp16 loss scaler skipped, named)."""
    assert checks.update is not None and checks.fit is not None
    update, skipped = checks.update, skipped_checks(checks)
    scaler = (f" (after {len(update['skipped_steps'])} steps skipped by the fp16 loss scaler)"
              if update.get("skipped_steps") else "")
    measured = [n for n in ("accumulation", "checkpointing") if f"{n}_check" not in skipped]
    agree = (f"{' and '.join(measured)} agree{'s' if len(measured) == 1 else ''}; " if measured else "")
    missing = "".join(f"{n.replace('_check', '')} {why}; " for n, why in skipped.items())
    return (f"Exactly the {update['expected']} expected tensors change{scaler}; {agree}{missing}"
            f"{checks.fit['verdict']['message']}; about {fmt_seconds(checks.fit['plan']['train_seconds'])} (m:ss) of "
            "training.")
