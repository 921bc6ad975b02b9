"""Time what a real training step costs, with the allocator a training process has.

On the CPU, stage 03 measures memory first (`labkit.preflight.measure.memory_pass`, glibc set for exact figures,
which slows a step) and times after, with glibc's own thresholds (`labkit.core.allocator.fast_allocator`): a timed
pass of the stage-04 trainer at a representative length. On CUDA the measured pass is the timed pass (its
measurement reads PyTorch's statistics and leaves the steps as training runs them,
`labkit.preflight.measure.step_time_kept`). Then one evaluation batch is timed; the time plan
(`labkit.preflight.timeplan.time_plan`) replays both over the whole training run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from labkit.card.schema import Card
from labkit.core.allocator import fast_allocator, release_promptly
from labkit.core.device import on_cuda
from labkit.core.progress import task
from labkit.errors import StageFailed
from labkit.preflight.measure import fixed_length_dataset, fixed_steps, memory_pass, step_time_kept
from labkit.train.callbacks import StepTimer
from labkit.train.trainer import build_trainer


def timed_pass(card: Card, model: Any, tokenizer: Any, data: Any, seq_len: int, output_dir: Path,
               device: str = "cpu", steps: int = 2, eval_rows: list[dict[str, Any]] | None = None,
               **overrides: Any) -> dict[str, Any]:
    """Run `steps` steps of the stage-04 trainer on `data` and time each; then one evaluation of `eval_rows`.

    The last step is the step time (the first allocates the optimiser states; the time plan charges its extra once).
    With `steps` 0 only the evaluation is timed (the steps were timed while their memory was measured, on CUDA).

    Args:
        card: the card.
        model: the model after `apply_method`, at its initial weights.
        tokenizer: the tokenizer.
        data: the training examples (`labkit.preflight.measure.fixed_length_dataset`), `steps` steps' worth.
        seq_len: their tokens (for the progress line).
        output_dir: scratch folder for the trainer.
        device: the model's device.
        steps: optimiser steps (0: none, the evaluation alone).
        eval_rows: validation rows (one evaluation batch, `eval.batch_size` rows) to time the trainer's evaluation on
            (sft cards; None: no evaluation timed).
        overrides: SFTConfig overrides (e.g. per_device_train_batch_size).
    Returns:
        {"step_seconds": [...], "seconds_per_step", "eval_seconds", "eval_tokens"} — eval_tokens: the padded tokens
        (rows × longest row per batch) the timed evaluation processed; both None without eval_rows.
    """
    timer, evaluation = StepTimer(), {"eval_seconds": None, "eval_tokens": None}
    evaluated = evaluated_rows(card, eval_rows)
    trainer = build_trainer(card, model, tokenizer, data, output_dir, device=device, eval_rows=evaluated,
                            eval_strategy="no", **fixed_steps(max(steps, 1)), **overrides)
    trainer.add_callback(timer)
    if steps:
        with task(f"timing: {steps} steps at {seq_len} tokens"):
            trainer.train()
    if evaluated:
        with task(f"timing one evaluation batch of {len(evaluated)} rows"):
            evaluation = time_evaluation(trainer)
    return {"step_seconds": timer.seconds, "seconds_per_step": timer.seconds[-1] if timer.seconds else None,
            **evaluation}


def evaluated_rows(card: Card, eval_rows: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The rows `timed_pass` times an evaluation on: `eval_rows` for an sft card, None otherwise (or without rows)."""
    return eval_rows if eval_rows and card.train.trainer == "sft" else None


def time_evaluation(trainer: Any) -> dict[str, Any]:
    """One `trainer.evaluate()` over its evaluation set: the seconds and the padded tokens it processed."""
    lengths = [len(ids) for ids in trainer.eval_dataset["input_ids"]]
    batch = trainer.args.per_device_eval_batch_size
    tokens = sum(len(lengths[i:i + batch]) * max(lengths[i:i + batch]) for i in range(0, len(lengths), batch))
    start = time.perf_counter()
    trainer.evaluate()
    return {"eval_seconds": time.perf_counter() - start, "eval_tokens": tokens}


def measure_step(card: Card, model: Any, tokenizer: Any, rows: list[dict[str, Any]], seq_len: int,
                 output_dir: Path, device: str = "cpu", steps: int = 2, eval_rows: list[dict[str, Any]] | None = None,
                 encoded: list[Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """One length measured, then timed: `memory_pass`, then `timed_pass` with the allocator as training has it
    (`fast_allocator`), then the allocator set back for exact figures; on CUDA the measured steps are the timed ones
    (`step_time_kept`) and `timed_pass` times the evaluation alone.

    Stage 03 runs every measured pass first and every timed pass after (`labkit.preflight.memory_check`); this is
    the one-length form the benchmarks and tests use.

    Args:
        card, model, tokenizer, device, steps, overrides: as for `labkit.preflight.measure.memory_pass`.
        rows: prepared training rows (their tokens fill the examples).
        seq_len: tokens per example.
        output_dir: scratch folder for the trainers.
        eval_rows: validation rows (one evaluation batch) to time the trainer's evaluation on.
        encoded: the rows encoded once (`encode_rows`), for `fixed_length_dataset`.
    Returns:
        {"seq_len", "micro_batch", "grad_accum", "memory", "memory_pass_seconds", "loss", "step_seconds",
         "seconds_per_step", "eval_seconds", "eval_tokens", "timed_by"} — timed_by: "memory pass" or "timed pass".
    """
    micro = overrides.get("per_device_train_batch_size", card.train.micro_batch)
    accum = overrides.get("gradient_accumulation_steps", card.train.grad_accum)
    data = fixed_length_dataset(tokenizer, card, rows, seq_len, micro * accum * steps, encoded=encoded)
    measured = memory_pass(card, model, tokenizer, data, seq_len, output_dir, device, steps, **overrides)
    switch = not step_time_kept(measured)  # the CPU: timed with the allocator as training has it
    if switch:
        fast_allocator()
    try:
        timed = time_measured(card, lambda: model, tokenizer, data, seq_len, measured, output_dir / "timed", device,
                              steps, eval_rows, **overrides)
    finally:
        if switch:
            release_promptly()
    return {"seq_len": seq_len, "micro_batch": micro, "grad_accum": accum, **measured, **timed}


def time_measured(card: Card, make_model: Callable[[], Any], tokenizer: Any, data: Any, seq_len: int,
                  measured: dict[str, Any], output_dir: Path, device: str = "cpu", steps: int = 2,
                  eval_rows: list[dict[str, Any]] | None = None, **overrides: Any) -> dict[str, Any]:
    """The step time of a measured length: `timed_pass` on the CPU; on CUDA the measured steps' own times
    (`step_time_kept`), and `timed_pass` only for the evaluation batch (no trainer at all without one).

    Args:
        card, tokenizer, data, seq_len, output_dir, device, steps, eval_rows, overrides: as for `timed_pass` (data:
            the measured pass's examples).
        make_model: returns the model at its initial weights (the shared model), called only when a pass runs.
        measured: the length's `memory_pass` result.
    Returns:
        {"step_seconds", "seconds_per_step", "eval_seconds", "eval_tokens", "timed_by"} — timed_by: "memory pass"
        (the measured steps' times) or "timed pass".
    """
    if not step_time_kept(measured):
        return {**timed_pass(card, make_model(), tokenizer, data, seq_len, output_dir, device,
                             steps, eval_rows, **overrides), "timed_by": "timed pass"}
    seconds = measured["memory_pass_seconds"]
    kept = {"step_seconds": seconds, "seconds_per_step": seconds[-1] if seconds else None, "timed_by": "memory pass"}
    if not evaluated_rows(card, eval_rows):
        return {"eval_seconds": None, "eval_tokens": None, **kept}
    return {**timed_pass(card, make_model(), tokenizer, data, seq_len, output_dir, device, 0,
                         eval_rows, **overrides), **kept}


class Phases:
    """Stage 03's two phases in one process: memory measured (glibc set for exact figures, `release_promptly`) until
    the first unmeasured step, then, for good, the allocator as a training process has it (`fast_allocator`; a step
    under the measurement's setting is much slower on the CPU). A measurement after that would count the memory the
    unmeasured steps left in the heap as the step's, so it is refused. On CUDA the allocator is PyTorch's and both
    phases are one.

    Args:
        device: the device the steps run on.
    """

    def __init__(self, device: str) -> None:
        self.device = device
        self.unmeasured = False  # an unmeasured step ran

    def measuring(self, what: str) -> None:
        """Raise `StageFailed` when an unmeasured step already ran (CPU); `what` names the measurement."""
        if self.unmeasured:
            raise StageFailed(f"{what} is measured before any step is timed or the update and accumulation checks "
                              "run (the memory they leave in the heap would be counted as the step's): restart the "
                              "kernel and run the notebook's cells in order")

    def unmeasured_from_here(self) -> None:
        """Nothing is measured from here on: the allocator as training has it (CPU; once)."""
        if not self.unmeasured and not on_cuda(self.device):
            fast_allocator()
            self.unmeasured = True
