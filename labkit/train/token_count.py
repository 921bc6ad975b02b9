"""Counting the tokens training actually fed the model, and the cost record stage 04 writes from the count.

A TrainerCallback never sees a batch, so the count is taken where the trainer fetches them: `CountedBatches`
(mixed into labkit's SFT, DPO and ORPO trainers) overrides `Trainer.get_batch_samples`, which every process calls
once per optimiser step with the micro-batches that step trains on, as the collator made them. Per micro-batch
(`batch_tokens`):

- tokens: the positions that are not padding: a 2-D attention mask's sum; for packed rows (a 4-D block mask, or
  padding-free position ids only) the positions up to each row's last non-zero position id (right padding has
  position 0, and every packed example is at least two tokens long); else every position;
- loss tokens: the positions whose next-token label is scored (`labels[:, 1:] != -100`; DPO's `completion_mask`).

Keys prefixed `chosen_` / `rejected_` (ORPO's batch) are counted alike. The step's counts are summed over the
processes (`accelerator.reduce`, every process calls it in the same step) into `TokenCount`, the callback that keeps
the totals, times the steps (fetching the batches to the end of the optimiser step; evaluation and checkpoints
excluded) and carries the totals across a resume (`labkit_tokens.json` in every checkpoint).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import EarlyStoppingCallback, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from labkit.data.prompting import IGNORE
from labkit.train.flops import convention, flops_per_token, forward_parameters, peak_flops

STATE_FILE = "labkit_tokens.json"  # in each checkpoint folder: the totals up to that step
PREFIXES = ("", "chosen_", "rejected_")


def _rows_tokens(batch: dict[str, Any], prefix: str) -> Any:
    mask = batch.get(prefix + "attention_mask")
    if torch.is_tensor(mask) and mask.dim() == 2:
        return mask.sum()
    positions = batch.get(prefix + "position_ids")
    if torch.is_tensor(positions):
        index = torch.arange(1, positions.shape[-1] + 1, device=positions.device)
        return ((positions > 0) * index).amax(dim=-1).clamp(min=1).sum()
    return torch.tensor(batch[prefix + "input_ids"].numel())


def batch_tokens(batch: dict[str, Any]) -> tuple[Any, Any]:
    """(tokens, loss tokens) of one collated micro-batch, as tensors on the batch's device.

    Args:
        batch: what the trainer's collator returned (input_ids, and attention_mask / position_ids / labels as there).
    Returns:
        (non-padding positions, positions whose label is scored).
    """
    tokens, loss = [], []
    device = next(v.device for v in batch.values() if torch.is_tensor(v))
    for prefix in PREFIXES:
        ids = batch.get(prefix + "input_ids")
        if not torch.is_tensor(ids):
            continue
        tokens.append(_rows_tokens(batch, prefix).to(device))
        labels, completion = batch.get(prefix + "labels"), batch.get(prefix + "completion_mask")
        if torch.is_tensor(labels):
            loss.append((labels[..., 1:] != IGNORE).sum().to(device))
        elif torch.is_tensor(completion):
            loss.append(completion[..., 1:].sum().to(device))
    zero = torch.zeros((), dtype=torch.long, device=device)
    return sum(tokens, zero).long(), sum(loss, zero).long()


class TokenCount(TrainerCallback):
    """Totals over every process: `tokens`, `loss_tokens` (the whole run, resumes included), `session_tokens` and
    `seconds` (this `train()` call: the optimiser steps' wall time on this process)."""

    def __init__(self) -> None:
        self.tokens = self.loss_tokens = self.session_tokens = 0
        self.seconds = 0.0
        self._pending: Any = None  # the step's summed counts (a device tensor: read at the step's end, no sync before)
        self._start: float | None = None

    def add(self, batches: list[dict[str, Any]], accelerator: Any, start: float) -> None:
        """Count one optimiser step's micro-batches, summed over the processes (every process calls this).

        Args:
            batches: the step's micro-batches, as collated.
            accelerator: the trainer's accelerate Accelerator.
            start: when fetching them began (time.perf_counter()).
        """
        self._start = start
        local = torch.stack([torch.stack(batch_tokens(b)).to(accelerator.device) for b in batches]).sum(dim=0)
        self._pending = accelerator.reduce(local, reduction="sum")

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        self.session_tokens, self.seconds = 0, 0.0
        saved = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}" / STATE_FILE
        if state.global_step and saved.exists():  # resumed: the totals up to the checkpoint
            totals = json.loads(saved.read_text(encoding="utf-8"))
            self.tokens, self.loss_tokens = totals["tokens"], totals["loss_tokens"]

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        if self._pending is None:
            return
        tokens, loss = (int(x) for x in self._pending.tolist())  # waits for the step's work on the device
        self.tokens, self.loss_tokens, self.session_tokens = (self.tokens + tokens, self.loss_tokens + loss,
                                                              self.session_tokens + tokens)
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
        self._pending = self._start = None

    def on_save(self, args, state, control, **kwargs):  # noqa: ANN001, ANN003
        folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            (folder / STATE_FILE).write_text(json.dumps({"tokens": self.tokens, "loss_tokens": self.loss_tokens,
                                                         "step": state.global_step}), encoding="utf-8")


class CountedBatches:
    """Mixed into a transformers Trainer: each optimiser step's micro-batches are counted by its `TokenCount`
    callback (when it has one) as they are fetched; none are fetched once the trainer has reached `max_steps`, or once
    its early stopping has run out of patience."""

    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
        state = self.state  # type: ignore[attr-defined]
        if 0 < state.max_steps <= state.global_step or _out_of_patience(self):
            # resumed from the checkpoint of the step that ended training: transformers' loop checks max_steps after a
            # step, not before the first, and clears early stopping's stop when training begins, so it would train on
            # (one step past max_steps, or to the next evaluation); no batches, no step
            return [], None
        start = time.perf_counter()
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)  # type: ignore[misc]
        counter = _counter(self)
        if counter is not None and batches:
            counter.add(batches, self.accelerator, start)  # type: ignore[attr-defined]
        return batches, items


def _out_of_patience(trainer: Any) -> bool:
    """Whether the trainer's early stopping (restored from a checkpoint) has already stopped training."""
    return any(isinstance(c, EarlyStoppingCallback) and c.early_stopping_patience_counter >= c.early_stopping_patience
               for c in trainer.callback_handler.callbacks)


def _counter(trainer: Any) -> TokenCount | None:
    return next((c for c in trainer.callback_handler.callbacks if isinstance(c, TokenCount)), None)


def _precision(args: Any) -> str:
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def cost_record(trainer: Any) -> dict[str, Any] | None:
    """The counted cost of a finished `train()` (a `labkit.stages.records.TrainingCost`); every process calls it
    (the CPU's peak is measured on each at once and summed, as they trained side by side).

    Args:
        trainer: the trainer after `train()`.
    Returns:
        the record, or None when the trainer has no `TokenCount`.
    """
    counter = _counter(trainer)
    if counter is None:
        return None
    model = trainer.accelerator.unwrap_model(trainer.model)
    n, trainable = forward_parameters(model)
    reference = 0
    if type(trainer).__name__.endswith("DPOTrainer") and not getattr(trainer.args, "precompute_ref_log_probs", False):
        reference = n - trainable if hasattr(model, "peft_config") else n  # the adapter off, or a frozen copy
    per_token = flops_per_token(n, trainable, reference)
    precision = _precision(trainer.args)
    peak, source = peak_flops(trainer.args.device, precision)
    world = trainer.args.world_size
    if peak is not None and trainer.args.device.type == "cpu":
        peak = float(trainer.accelerator.reduce(torch.tensor(peak, dtype=torch.float64, device=trainer.accelerator.device),
                                                reduction="sum"))  # each process's measured rate, at the same time
    elif peak is not None:
        peak = peak * world
    speed = counter.session_tokens / counter.seconds if counter.seconds > 0 else None
    return {"tokens": counter.tokens, "loss_tokens": counter.loss_tokens, "session_tokens": counter.session_tokens,
            "step_seconds": counter.seconds, "tokens_per_second": speed, "parameters": n,
            "trainable_parameters": trainable, "reference_parameters": reference, "flops_per_token": per_token,
            "convention": convention(n, trainable, reference), "precision": precision, "peak_flops": peak,
            "peak_source": source, "world_size": world,
            "mfu": per_token * speed / peak if speed is not None and peak else None}
