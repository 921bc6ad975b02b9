"""One arm of a stage-03 step check: real optimiser steps of the stage-04 trainer, fp16-aware and sized first.

- `StepRecord`: a TrainerCallback recording every optimiser step the trainer runs — taken, or skipped by the fp16
  loss scaler (inf/NaN gradients at its scale) — with the step's loss (logged every step, unfiltered), the
  gradients unscaled before they are read, and the tensors whose gradients are inf/NaN; it stops training once
  `steps` steps were really taken, so a scaler that skips the first steps (it starts at 2^16) does not shorten a
  check.
- `one_update`: one optimiser step really taken, its gradients and loss (and optionally its peak memory).
- `run_arm`: `one_update` costed first by the memory estimate against the device's free memory; an arm that would
  not fit, or that runs out of memory, is "not measurable on this device" instead of an error.

Dropout is off in every arm (`no_dropout`): the arms of a comparison draw their random masks over different
batch shapes and orders, so with dropout on (LoRA's `lora_dropout`, a model's residual dropout) they could never
agree; what is compared is the arithmetic of accumulation and checkpointing, not the masks. For the same reason the
accumulation arms leave out a mixture of experts' load-balancing loss (`load_balancing`), a statistic of each
micro-batch's routing.

Skipped steps: accelerate's `optimizer_step_was_skipped` misses a skip by a fused optimizer (the default
`adamw_torch_fused`: `GradScaler.step` hands it `found_inf` and the optimizer skips inside its own `step`), so a
step counts as skipped when accelerate says so, when the scaler lowered its scale, or when it holds inf/NaN
gradients (what the scaler skips on).
"""

from __future__ import annotations

import contextlib
import gc
import math
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from accelerate.optimizer import AcceleratedOptimizer
from torch.amp.grad_scaler import OptState
from transformers import TrainerCallback

from labkit.card.schema import Card
from labkit.core.allocator import trim
from labkit.core.device import on_cuda
from labkit.preflight.measure import PeakMemory
from labkit.preflight.activations import text_config
from labkit.preflight.sizing import arm_bytes, not_measurable
from labkit.train.trainer import build_trainer

# a mixture of experts' load-balancing loss is a statistic of each micro-batch's routing: it differs between one batch
# and its micro-batches by design (TRL averages it over them), so the accumulation arms leave it out
LOAD_BALANCING_NOTE = ("the load-balancing (router aux) loss is off in both arms: computed per micro-batch from its own "
                       "routing, it differs from one large batch's by design; training keeps it, at coefficient {coef:g}")
# steps the fp16 loss scaler may skip (halving its scale from 2^16 each time) before a check counts the gradients as
# inf/NaN at every scale; a healthy fp16 run skips a few at the start
SCALER_SKIPS = 10


def _inner(optimizer: Any) -> Any:
    while isinstance(optimizer, AcceleratedOptimizer):
        optimizer = optimizer.optimizer
    return optimizer


class StepRecord(TrainerCallback):
    """Each optimiser step of a trainer: taken or skipped by the loss scaler, its loss and its non-finite gradients.

    Args:
        trainer: the trainer (its accelerator holds the fp16 loss scaler); the record adds itself as a callback and
            turns off the trainer's filter that replaces an inf/NaN loss in the logs by the running average.
        steps: stop training after this many steps really taken (the trainer's max_steps may leave room for skips).
        keep_grads: keep the (unscaled, float32) gradients of the last step taken in `grads`.
        keep_first: keep a copy of the trainable tensors after the first step taken in `first`.
    Attributes:
        steps_run: [{"step", "skipped", "loss", "scale", "nonfinite_gradients", "first_nonfinite"}], one per step.
    """

    def __init__(self, trainer: Any, steps: int, keep_grads: bool = False, keep_first: bool = False) -> None:
        self.trainer, self.steps, self.keep_grads, self.keep_first = trainer, steps, keep_grads, keep_first
        self.steps_run: list[dict[str, Any]] = []
        self.grads: dict[str, Any] | None = None
        self.first: dict[str, Any] | None = None
        self._grads: dict[str, Any] | None = None
        self._bad: list[str] = []
        self._scale: float | None = None
        trainer.args.logging_nan_inf_filter = False  # a NaN loss must reach the log, not the running average
        trainer.add_callback(self)

    @property
    def taken(self) -> int:
        """Optimiser steps really taken."""
        return sum(not s["skipped"] for s in self.steps_run)

    @property
    def skipped(self) -> list[int]:
        """The trainer steps the fp16 loss scaler skipped."""
        return [s["step"] for s in self.steps_run if s["skipped"]]

    def _scaler(self) -> Any:
        return getattr(self.trainer.accelerator, "scaler", None)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):  # noqa: ANN001, ANN003
        scaler, inner = self._scaler(), _inner(optimizer)
        if scaler is not None and inner is not None:
            self._scale = float(scaler.get_scale())
            if scaler._per_optimizer_states[id(inner)]["stage"] is OptState.READY:
                scaler.unscale_(inner)  # what accelerate does only when clipping or for native AMP: read true gradients
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        self._bad = [n for n, g in grads.items() if not bool(torch.isfinite(g).all())]
        if self.keep_grads:
            self._grads = {n: g.detach().float().clone() for n, g in grads.items()}

    def on_step_end(self, args, state, control, model=None, **kwargs):  # noqa: ANN001, ANN003
        scaler = self._scaler()
        lowered = scaler is not None and self._scale is not None and float(scaler.get_scale()) < self._scale
        # GradScaler skips exactly the steps with inf/NaN gradients
        skipped = bool(self.trainer.accelerator.optimizer_step_was_skipped) or lowered or (
            scaler is not None and bool(self._bad))
        self.steps_run.append({"step": state.global_step, "skipped": skipped, "loss": None, "scale": self._scale,
                               "nonfinite_gradients": len(self._bad), "first_nonfinite": self._bad[0] if self._bad else None})
        if not skipped:
            self.grads = self._grads if self.keep_grads else None
            if self.keep_first and self.first is None:
                self.first = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        self._grads = None
        control.should_log = True  # every step's loss
        if self.taken >= self.steps:
            control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):  # noqa: ANN001, ANN003
        if logs and "loss" in logs and self.steps_run and self.steps_run[-1]["step"] == state.global_step:
            self.steps_run[-1]["loss"] = float(logs["loss"])

    def nonfinite(self, scaled: bool | None = None) -> list[str]:
        """The non-finite values found, one line each: a loss, gradients of a step taken, every step skipped.

        Args:
            scaled: whether inf/NaN gradients are the loss scaler's to skip (default: the trainer has a scaler).
        """
        scaled = self._scaler() is not None if scaled is None else scaled
        out = [f"step {s['step']}: the loss is {s['loss']}" for s in self.steps_run
               if s["loss"] is not None and not math.isfinite(s["loss"])]
        for s in self.steps_run:
            if s["nonfinite_gradients"] and not (scaled and s["skipped"]):
                out.append(f"step {s['step']}: {s['nonfinite_gradients']} tensors have inf/NaN gradients, "
                           f"e.g. {s['first_nonfinite']}")
        if self.steps_run and not self.taken:
            scales = [s["scale"] for s in self.steps_run if s["scale"] is not None]
            where = f" (loss scale {scales[0]:g} down to {scales[-1]:g})" if scales else ""
            out.append(f"no optimiser step was taken: the loss scaler skipped all {len(self.steps_run)} steps, the "
                       f"gradients are inf/NaN at every scale{where}")
        return out


@contextmanager
def no_dropout(model: Any) -> Iterator[int]:
    """Dropout off inside the block, restored after: every dropout module's p, and every float dropout setting a module
    applies itself with `nn.functional.dropout` (`attention_dropout`; Seed-OSS's `residual_dropout`; a `*_pdrop`).

    Yields:
        how many dropout settings were non-zero (and are off inside the block).
    """
    saved: list[tuple[Any, str, float]] = []
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            saved.append((module, "p", module.p))
        else:
            saved += [(module, name, value) for name, value in vars(module).items()
                      if isinstance(value, float) and ("dropout" in name or name.endswith("pdrop"))]
    for module, name, _ in saved:
        setattr(module, name, 0.0)
    try:
        yield sum(1 for _, _, value in saved if value)
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def load_balancing(card: Card, model: Any) -> str | None:
    """Why an arm trains without the router's load-balancing loss (`LOAD_BALANCING_NOTE`): an SFT card on a mixture of
    experts whose coefficient TRL takes from its config (non-zero); None otherwise."""
    config = text_config(model.config)
    coef = getattr(config, "router_aux_loss_coef", 0.0) or 0.0
    moe = hasattr(config, "output_router_logits") and coef != 0.0
    return LOAD_BALANCING_NOTE.format(coef=coef) if moe and card.train.trainer == "sft" else None


@contextmanager
def router_config_kept(model: Any) -> Iterator[None]:
    """A mixture of experts' router settings (`output_router_logits`, `router_aux_loss_coef`), which TRL's SFTTrainer
    writes into the model's text config when it is built, as they were before the block."""
    config = text_config(model.config)
    saved = {k: getattr(config, k) for k in ("output_router_logits", "router_aux_loss_coef") if hasattr(config, k)}
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


def one_update(card: Card, make_model: Callable[[], Any], tokenizer: Any, data: Any, device: str,
               measure: bool = False, balance: bool = True, **overrides: Any) -> dict[str, Any]:
    """One optimiser step really taken by the stage-04 trainer: the gradients before it (unscaled) and its loss.

    Steps the fp16 loss scaler skips leave the weights and optimiser as they were, and the data is one step's worth
    (the next step repeats it), so the step taken is the step from the initial weights on the same batch. With
    `balance` False a mixture of experts' load-balancing loss is left out (`load_balancing`).

    Returns:
        {"grads" (None when no step was taken), "loss", "memory" (with `measure`), "skipped_steps", "nonfinite",
         "load_balancing" (why the router's load-balancing loss was left out, with `balance` False; else None)}.
    """
    model = make_model()
    balancing = None if balance else load_balancing(card, model)
    if balancing:
        overrides = {**overrides, "router_aux_loss_coef": 0.0}
    with router_config_kept(model):  # an override of TRL's router_aux_loss_coef lands in the (shared) model's config
        trainer = build_trainer(card, model, tokenizer, data, Path(tempfile.mkdtemp(prefix="labkit-check-")),
                                device=device, max_steps=1 + SCALER_SKIPS, lr_scheduler_type="constant", warmup_steps=0,
                                logging_steps=1, max_grad_norm=0.0, train_sampling_strategy="sequential",
                                disable_tqdm=True, **overrides)
        record = StepRecord(trainer, steps=1, keep_grads=True)
        peak = PeakMemory(device) if measure else None  # it sets the allocator for exact figures: a slower CPU step
        with no_dropout(model), peak or contextlib.nullcontext():
            trainer.train()
    taken = [s for s in record.steps_run if not s["skipped"]]
    loss = (taken or record.steps_run or [{"loss": float("nan")}])[-1]["loss"]
    return {"grads": record.grads, "loss": float("nan") if loss is None else float(loss),
            "memory": peak.as_dict() if peak else None, "skipped_steps": record.skipped,
            "nonfinite": record.nonfinite(), "load_balancing": balancing}


def out_of_memory(error: BaseException) -> bool:
    """Whether an exception is the device running out of memory (CUDA / the CPU allocator / Python)."""
    return isinstance(error, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and ("DefaultCPUAllocator: can't allocate" in str(error)
                                             or "out of memory" in str(error).lower()))


def release(device: str) -> None:
    """Free what a failed arm left (its trainer, activations), on the device and in host memory."""
    gc.collect()
    if on_cuda(device) and torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim()


def run_arm(card: Card, make_model: Callable[[], Any], tokenizer: Any, data: Any, device: str, what: str,
            size: dict[str, Any] | None = None, measure: bool = False, **overrides: Any) -> dict[str, Any]:
    """`one_update`, costed first by the memory estimate against the free memory; out of memory is not an error.

    Args:
        card, make_model, tokenizer, data, device, measure, overrides: as for `one_update`.
        what: the arm in words (e.g. "one batch of 8 rows at 512 tokens"), for the reason it was not measured.
        size: {"config", "free_bytes", "seq_len", "micro_batch", "checkpointing", "loss_fraction", and optionally
            "estimate", the arm's estimate already made} to cost the arm (`labkit.preflight.sizing.arm_bytes`);
            None: not costed (an out-of-memory error is still caught).
    Returns:
        `one_update`'s result with "needed_bytes" (None: not costed), or {"not_measurable": reason, "needed_bytes"}.
    """
    needed = free = None
    if size is not None and size.get("config") is not None and size.get("free_bytes") is not None:
        free = size["free_bytes"]
        needed = arm_bytes(size["config"], card, size["seq_len"], size["micro_batch"], size["checkpointing"], device,
                           size.get("loss_fraction", 1.0), size.get("estimate"))
        if needed is not None and needed > free:
            return {"not_measurable": not_measurable(needed, free, what), "needed_bytes": needed}
    try:
        return {**one_update(card, make_model, tokenizer, data, device, measure, **overrides), "needed_bytes": needed}
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as error:
        if not out_of_memory(error):
            raise
        said = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
    release(device)
    reason = (not_measurable(needed, free, what) if needed is not None and free is not None
              else f"not measurable on this device: out of memory ({what})")
    return {"not_measurable": f"{reason}; out of memory: {said}", "needed_bytes": needed}
