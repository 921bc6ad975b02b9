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

from labkit.card.schema import OPTIMIZERS, Card
from labkit.data.prompting import encode_rows
from labkit.model.placement import one_gpu
from labkit.scoring.metrics import METRICS
from labkit.train.packing import PackedCollator, pack
from labkit.train.preference import preference_trainer
from labkit.train.resilience import Interruption

# datasets, torch, transformers, trl, transformers (labkit.train.early_stopping), trl (labkit.train.loss_head) take
# seconds to import: imported inside the functions that use them, so `labkit` commands and card checks start fast


def to_dataset(tokenizer: Any, card: Card, rows: list[dict[str, Any]]) -> Any:
    """A datasets.Dataset of input_ids and labels for TRL (pre-tokenised; packed rows when train.packing)."""
    import datasets

    examples = [{"input_ids": e.input_ids, "labels": e.labels} for e in encode_rows(tokenizer, card, rows)]
    if card.train.packing:
        examples = pack(examples, card.data.max_length)
    return datasets.Dataset.from_list(examples)


def _precision(card: Card, device: str) -> dict[str, bool]:
    """The trainer's bf16 / fp16 flags: `labkit.model.placement.decide`'s precision for this device."""
    from labkit.model.loading import decisions

    precision = decisions(card, device).precision
    return {"bf16": precision == "bf16", "fp16": precision == "fp16"}


class BudgetCallback:
    """Stops training (cleanly, after the current step) when the card's time budget is spent."""

    def __init__(self, max_minutes: float) -> None:
        self.max_seconds = max_minutes * 60
        self.start = time.monotonic()
        self.exhausted = False

    def callback(self) -> Any:
        from transformers import TrainerCallback

        outer = self

        class _Budget(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
                if time.monotonic() - outer.start > outer.max_seconds:
                    outer.exhausted = True
                    control.should_training_stop = True
                    control.should_save = args.save_strategy != "no"  # a checkpoint to continue from
                return control

        return _Budget()


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
    from trl import SFTConfig

    from labkit.train.loss_head import CompletionSFTTrainer

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
        from labkit.train.early_stopping import trainer_arguments

        save_kwargs.update(trainer_arguments(stopping, eval_kwargs["eval_steps"]))
    config = dict(
        output_dir=str(output_dir), per_device_train_batch_size=t.micro_batch, gradient_accumulation_steps=t.grad_accum,
        learning_rate=t.lr, lr_scheduler_type=t.scheduler, warmup_steps=t.warmup_ratio, weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm, activation_checkpointing=t.gradient_checkpointing, packing=False,
        padding_free=False, max_length=card.data.max_length, seed=t.seed, data_seed=t.seed,
        optim=OPTIMIZERS[t.optimizer][1], logging_steps=1 if checkpoints else t.logging_steps, logging_first_step=True,
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
    if stopping:  # on eval_loss, or on a generation metric added to each evaluation (labkit/train/early_stopping.py)
        from labkit.train.early_stopping import callbacks as stopping_callbacks

        callbacks += stopping_callbacks(card, tokenizer, eval_rows)
    model.config.use_cache = False  # no KV cache in training (and required for packed isolation)
    if t.trainer != "sft":  # preference pairs: TRL's DPO/ORPO trainer with the same arguments and callbacks

        return _attach(preference_trainer(card, model, tokenizer, train_rows, eval_rows, config, callbacks),
                       budget, interruption, checkpoints, t.logging_steps, output_dir)
    train_dataset = train_rows if hasattr(train_rows, "column_names") else to_dataset(tokenizer, card, train_rows)
    collator = None
    if t.packing:  # labkit packs (packing.py): block-diagonal masks, so examples never attend to each other

        from labkit.model.loading import decisions

        collator = PackedCollator(tokenizer.pad_token_id, next(model.parameters()).dtype
                                  if next(model.parameters()).is_floating_point() else None,
                                  block_mask=decisions(card, device).packing != "padding_free")
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


def report_to(card: Card) -> list[str]:
    """The trainer's `report_to` from the card's `tracking` section: "tensorboard", and "mlflow" when `labkit run`
    mirrors this run into MLflow (it sets MLFLOW_RUN_ID, so the step metrics join the mirrored run).

    Args:
        card: the card.
    Returns:
        the integrations' names (empty: none).
    """
    names = ["tensorboard"] if card.tracking.tensorboard else []
    if card.tracking.mlflow is not None and os.environ.get("MLFLOW_RUN_ID"):
        names.append("mlflow")
    return names


def _attach(trainer: Any, budget: BudgetCallback, interruption: Any, checkpoints: bool, logging_steps: int,
            output_dir: Path) -> Any:
    """What stage 04 reads from every trainer (budget, interruption), the printing of every `logging_steps`, live
    progress and the TensorBoard folder (`training/tensorboard`, next to the trainer's output folder)."""
    trainer.labkit_budget = budget
    trainer.labkit_interruption = interruption
    if checkpoints:
        _print_every(trainer, logging_steps)
        from labkit.train.live import progress_callback, tensorboard_into

        trainer.add_callback(progress_callback(logging_steps))
        tensorboard_into(trainer, Path(output_dir).parent / "tensorboard")
    return trainer


def _print_every(trainer: Any, every: int) -> None:
    """Print the training loss every `every` steps (and every evaluation) although every step is logged."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    def keep(state: Any, logs: dict[str, Any] | None) -> bool:
        logs = logs or {}
        return state.global_step % every == 0 or state.global_step <= 1 or "loss" not in logs

    class _Progress(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            if keep(state, logs):
                super().on_log(args, state, control, logs=logs, **kwargs)

    class _Printer(PrinterCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
            if keep(state, logs):
                super().on_log(args, state, control, logs=logs, **kwargs)

    class _NotebookProgress(NotebookProgressCallback):
        # transformers 5.24's notebook bar starts at the first step's end (step + 1); a run that ends at that very
        # step (2 steps after it started or resumed, e.g. resumed from checkpoint-8 and early-stopped at step 10)
        # keeps a stale time estimate with no rate, and on_train_end divides by None (TypeError)
        def on_train_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
            tracker = self.training_tracker
            if tracker is not None and state.global_step <= (getattr(tracker, "start_value", None) or 0):
                tracker.predicted_remaining = None  # the run is over: nothing left to predict
            return super().on_train_end(args, state, control, **kwargs)

    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(_Progress())
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(_Printer())
    if trainer.pop_callback(NotebookProgressCallback) is not None:
        trainer.add_callback(_NotebookProgress())


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
