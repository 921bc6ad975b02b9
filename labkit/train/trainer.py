"""Training through TRL's SFTTrainer on labkit's own tokenisation (loss on the completion only).

The dataset handed to TRL is already tokenised by `labkit.data.prompting` (input_ids + labels), so the
tokens inspected in stage 02 are exactly the tokens trained on. Cards with `train.trainer: dpo | orpo`
get TRL's DPOTrainer / ORPOTrainer from `labkit.train.preference`, with the same arguments and callbacks.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import datasets
from trl import SFTConfig

from labkit.card.schema import OPTIMIZERS, Card
from labkit.data.prompting import encode_rows
from labkit.model.loading import decisions
from labkit.model.method import trainer_checkpointing
from labkit.model.placement import one_gpu
from labkit.scoring.names import METRICS
from labkit.train.callbacks import (
    BudgetStop,
    FiniteCheck,
    LiveProgress,
    numerics_fix,
    tensorboard_into,
    thin_progress,
)
from labkit.train.early_stopping import callbacks as stopping_callbacks
from labkit.train.early_stopping import trainer_arguments
from labkit.train.loss_head import CompletionSFTTrainer
from labkit.train.packing import PackedCollator, pack
from labkit.train.preference import preference_trainer
from labkit.train.resilience import Interruption
from labkit.train.token_count import TokenCount


def to_dataset(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> Any:
    """A datasets.Dataset of input_ids and labels for TRL (pre-tokenised; packed rows when train.packing)."""
    examples = [{"input_ids": e.input_ids, "labels": e.labels} for e in encode_rows(tokenizer, card, rows)]
    if card.train.packing:
        examples = pack(examples, card.data.max_length)
    return datasets.Dataset.from_list(examples)


def _precision(card: Card, device: str) -> dict[str, bool]:
    """The trainer's bf16 / fp16 flags: `labkit.model.placement.decide`'s precision for this device."""
    precision = decisions(card, device).precision
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


class BudgetCallback:
    """Stops training (cleanly, after the current step) when the card's time budget is spent."""

    def __init__(self, max_minutes: float) -> None:
        self.max_seconds = max_minutes * 60
        self.start = time.monotonic()
        self.exhausted = False
        self.warning: str | None = None  # the ETA exceeded the budget left (labkit.train.callbacks.budget_warning)

    def callback(self) -> Any:
        """The TrainerCallback that stops training on this budget (`labkit.train.callbacks.BudgetStop`)."""
        return BudgetStop(self)


def build_trainer(card: Card, model: Any, tokenizer: Any, train_rows: Any, output_dir: Path,
                  eval_rows: list[dict[str, Any]] | None = None, device: str = "cpu", checkpoints: bool = False,
                  **overrides: Any) -> Any:
    """Build the trainer that stage 04 trains with (stage 03 uses it for its checks): SFT, or DPO/ORPO (train.trainer).

    Args:
        card: the card (train section).
        model: the model after `labkit.model.method.apply_method`.
        tokenizer: the tokenizer.
        train_rows: prepared training rows, or an already tokenised datasets.Dataset (input_ids, labels; for
            dpo/orpo the columns of `labkit.train.preference.to_dataset`).
        output_dir: where the trainer writes.
        eval_rows: validation rows for the evaluation loss (and train.early_stopping's generation metric) during
            training (optional).
        device: the device the model is on.
        checkpoints: write checkpoints every train.save_steps and at the end, and stop cleanly
            (checkpoint first) on SIGTERM / Ctrl-C (stage 04); off for stage 03's short checks.
        overrides: SFTConfig fields to override (e.g. max_steps=2 for the update check).
    Returns:
        a trl.SFTTrainer (labkit's `CompletionSFTTrainer`: on the CPU the loss projects only the completion
            positions), or labkit.train.preference's DPO/ORPO trainer.
    """
    t = card.train
    steps = {"max_steps": t.max_steps} if t.max_steps else {"num_train_epochs": t.epochs, "max_steps": -1}
    total = t.max_steps or math.ceil(math.ceil(len(train_rows) / t.micro_batch) / t.grad_accum * t.epochs)
    eval_kwargs: dict[str, Any] = {"eval_strategy": "no"}
    if eval_rows:
        eval_kwargs = {"eval_strategy": "steps", "eval_steps": t.eval_steps or max(1, total // 4),
                       "per_device_eval_batch_size": card.eval.batch_size}
    save_kwargs: dict[str, Any] = {"save_strategy": "no"}
    if checkpoints:
        # the history records every step, so a run resumed from any checkpoint has the uninterrupted run's
        # curve point for point (a logged average over several steps would straddle the interruption)
        save_kwargs = {"save_strategy": "steps", "save_steps": t.save_steps or max(1, total // 4),
                       "save_total_limit": t.save_total_limit}
    stopping = t.early_stopping if checkpoints and eval_rows else None
    if stopping:  # every evaluation is a checkpoint, so the best one can be restored at the end
        save_kwargs.update(trainer_arguments(stopping, eval_kwargs["eval_steps"]))
    config = dict(
        output_dir=str(output_dir), per_device_train_batch_size=t.micro_batch, gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.lr, lr_scheduler_type=t.scheduler, warmup_steps=t.warmup_ratio, weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, activation_checkpointing=trainer_checkpointing(card), packing=False,
        padding_free=False, max_length=card.data.max_length, seed=t.seed, data_seed=t.seed,
        optim=OPTIMIZERS[t.optimizer][1], logging_steps=1 if checkpoints else t.logging_steps, logging_first_step=True,
        logging_nan_inf_filter=False,  # a NaN loss is logged as NaN, never replaced by the previous losses' average
        report_to=report_to(card) if checkpoints else "none",
        use_cpu=device == "cpu", dataloader_num_workers=0, completion_only_loss=True, disable_tqdm=False,
        **steps, **eval_kwargs, **save_kwargs, **_precision(card, device))
    if t.packing:
        config["remove_unused_columns"] = False  # keep position_ids (PEFT's forward does not name them)
    config.update(overrides)
    if config["activation_checkpointing"]:
        config.setdefault("activation_checkpointing_kwargs", {"use_reentrant": False})
    callbacks = []
    budget = BudgetCallback(card.budget.max_minutes)
    callbacks.append(budget.callback())
    interruption = Interruption()
    if checkpoints:
        callbacks.append(interruption.callback())
        # every step is logged in stage 04: each one's loss and gradient norm must be finite
        callbacks.append(FiniteCheck(_fix(card, model, device)))
    if stopping:  # on eval_loss, or on a generation metric added to each evaluation (labkit/train/early_stopping.py)
        callbacks += stopping_callbacks(card, tokenizer, eval_rows)
    model.config.use_cache = False  # no KV cache in training (and required for packed isolation)
    if t.trainer != "sft":  # preference pairs: TRL's DPO/ORPO trainer with the same arguments and callbacks

        return _attach(preference_trainer(card, model, tokenizer, train_rows, eval_rows, config, callbacks),
                       budget, interruption, checkpoints, t.logging_steps, output_dir)
    train_dataset = train_rows if hasattr(train_rows, "column_names") else to_dataset(tokenizer, card, train_rows)
    collator = None
    if t.packing:  # labkit packs (packing.py): block-diagonal masks, so examples never attend to each other

        collator = PackedCollator(tokenizer.pad_token_id, next(model.parameters()).dtype
                                  if next(model.parameters()).is_floating_point() else None,
                                  block_mask=_made(card, model, device).get("packing") != "padding_free")
    args = SFTConfig(**config)
    one_gpu(args, getattr(model, "labkit_decisions", None))  # several GPUs, no launcher: cuda:0
    trainer = CompletionSFTTrainer(
        model=model, args=args, train_dataset=train_dataset, data_collator=collator,
        eval_dataset=to_dataset(tokenizer, card, eval_rows) if eval_rows else None, processing_class=tokenizer,
        callbacks=callbacks)
    _attach(trainer, budget, interruption, checkpoints, t.logging_steps, output_dir)
    trainer.labkit_decisions = getattr(model, "labkit_decisions", None)
    if t.loss_normalisation == "micro_batch_mean":
        # each micro-batch's own token mean, divided by the accumulation count (no num_items_in_batch)
        trainer.model_accepts_loss_kwargs = False
    return trainer


def _made(card: Card, model: Any, device: str) -> dict[str, Any]:
    """The decisions the model was loaded with (`labkit.model.loading.model_decisions`: the architecture's attention
    and packing path), else the card's on this device."""
    return getattr(model, "labkit_decisions", None) or decisions(card, device).as_dict()


def _fix(card: Card, model: Any, device: str) -> str:
    """The fix a non-finite loss names: the card's lr and clipping, the precision and the attention the model runs."""
    made = _made(card, model, device)
    return numerics_fix(card.train.lr, card.train.max_grad_norm, made.get("precision", ""), made.get("attention", ""))


def report_to(card: Card) -> list[str]:
    """The trainer's `report_to` from the card's `tracking` section: "tensorboard", "mlflow" and "wandb" when
    `labkit run` mirrors this run there (it sets MLFLOW_RUN_ID / WANDB_RUN_ID, so the step metrics join the mirrored
    run, once; the mirror itself sends no step metric).

    Args:
        card: the card.
    Returns:
        the integrations' names (empty: none).
    """
    names = ["tensorboard"] if card.tracking.tensorboard else []
    if card.tracking.mlflow is not None and os.environ.get("MLFLOW_RUN_ID"):
        names.append("mlflow")
    if card.tracking.wandb_settings() is not None and os.environ.get("WANDB_RUN_ID"):
        names.append("wandb")
    return names


def _attach(trainer: Any, budget: BudgetCallback, interruption: Any, checkpoints: bool, logging_steps: int,
            output_dir: Path) -> Any:
    """What stage 04 reads from every trainer (budget, interruption, token count), the printing of every `logging_steps`, live
    progress and the TensorBoard folder (`training/tensorboard`, next to the trainer's output folder)."""
    trainer.labkit_budget = budget
    trainer.labkit_interruption = interruption
    trainer.add_callback(TokenCount())  # the tokens trained on (labkit.train.token_count): stage 04's cost record
    if checkpoints:
        thin_progress(trainer, logging_steps)
        trainer.add_callback(LiveProgress(logging_steps, budget))
        tensorboard_into(trainer, Path(output_dir).parent / "tensorboard")
    return trainer


def loss_history(trainer: Any) -> list[dict[str, Any]]:
    """The trainer's log history as rows {"step", "epoch", "loss"|"eval_loss"|"eval_<metric>", "learning_rate", …}."""
    keep = ("step", "epoch", "loss", "eval_loss", "learning_rate", "grad_norm", "train_runtime",
            "eval_generation_runtime", *(f"eval_{name}" for name in METRICS),  # generation metrics: early stopping
            # dpo/orpo: is the chosen answer preferred, and by how much (TRL's names)
            "rewards/accuracies", "rewards/margins", "eval_rewards/accuracies", "eval_rewards/margins")
    rows = []
    for entry in trainer.state.log_history:
        row = {k: entry[k] for k in keep if k in entry}
        row.setdefault("step", trainer.state.global_step)
        rows.append(row)
    return rows
